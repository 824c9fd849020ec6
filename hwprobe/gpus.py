"""Known NVIDIA GPUs: peak memory bandwidth by name, for the planner's expected decode speed.

NVML does not report bandwidth directly (bus width x memory clock is unreliable for GDDR6X), so the figure comes
from the vendors' spec sheets.  Matching is by the longest name fragment contained in the device name, so
"NVIDIA GeForce RTX 3090 Ti" finds "3090 ti" before "3090".
"""

from __future__ import annotations

# name fragment (lower case) -> peak memory bandwidth, GB/s
_BANDWIDTH_GBPS = {
    "rtx 5090": 1792,
    "rtx 5080": 960,
    "rtx 5070 ti": 896,
    "rtx 5070": 672,
    "rtx 4090": 1008,
    "rtx 4080": 717,
    "rtx 4070 ti": 504,
    "rtx 4070": 504,
    "rtx 4060 ti": 288,
    "rtx 4060": 272,
    "rtx 4060 laptop": 256,
    "rtx 4070 laptop": 256,
    "rtx 4080 laptop": 432,
    "rtx 4090 laptop": 576,
    "rtx 3090 ti": 1008,
    "rtx 3090": 936,
    "rtx 3080 ti": 912,
    "rtx 3080": 760,
    "rtx 3070": 448,
    "rtx 3060 ti": 448,
    "rtx 3060": 360,
    "rtx 2080 ti": 616,
    "rtx 2080": 448,
    "rtx 2070": 448,
    "rtx 2060": 336,
    "titan rtx": 672,
    "rtx a6000": 768,
    "rtx 6000 ada": 960,
    "rtx a5000": 768,
    "rtx a4000": 448,
    "a100-sxm4-80gb": 2039,
    "a100 80gb": 1935,
    "a100": 1555,
    "h100 pcie": 2000,
    "h100": 3350,
    "h200": 4800,
    "l40s": 864,
    "l40": 864,
    "l4": 300,
    "a10g": 600,
    "a10": 600,
    "t4": 320,
    "v100": 900,
}


def known_bandwidth_gbps(name: str) -> float | None:
    """Peak memory bandwidth of a GPU by its marketing name, or None when it is not in the table."""
    lower = name.lower()
    best = max((k for k in _BANDWIDTH_GBPS if k in lower), key=len, default=None)
    return float(_BANDWIDTH_GBPS[best]) if best else None


# name fragment (lower case) -> GPU generation as hwprobe.decode_speed names them, for a GPU record that carries a
# name and no compute capability (scripts/gpu_record_table.py)
_GENERATION = {
    "rtx 50": "blackwell",
    "rtx 40": "ada",
    "6000 ada": "ada",
    "l40": "ada",
    "l4": "ada",
    "rtx 30": "ampere",
    "a100": "ampere",
    "a10": "ampere",
    "rtx a": "ampere",
    "h100": "hopper",
    "h200": "hopper",
    "rtx 20": "turing",
    "titan rtx": "turing",
    "t4": "turing",
}


def known_generation(name: str) -> str | None:
    """The GPU generation ("ampere", "ada", "hopper", ...) of a GPU by its marketing name, or None."""
    lower = name.lower()
    best = max((k for k in _GENERATION if k in lower), key=len, default=None)
    return _GENERATION[best] if best else None
