"""This CPU's model name and flags, read from /proc/cpuinfo (what the runner's memory keys on, and what decides
llama.cpp's extra buffer types: backends/llama_cpp/extra_bufts.py)."""

from __future__ import annotations

from pathlib import Path

from hwprobe.probe import read_cpuinfo


def cpu_identity(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """(model name, flags) of this CPU; ("unknown", {}) where /proc/cpuinfo cannot be read."""
    try:
        model, flags = read_cpuinfo(Path(cpuinfo).read_text(errors="replace"))
    except OSError:
        return "unknown", frozenset()
    return model or "unknown", frozenset(flags)


def has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    return any(f.startswith("amx") for f in cpu_identity(cpuinfo)[1])
