"""HardwareReport and GpuInfo: what a machine has, each figure with where it came from.

`probe()` fills these from NVML / torch.cuda / psutil / /proc/cpuinfo; `load_report(path)` reads the JSON that
`hearth probe --json` writes, so a plan can be made for another machine (`--hardware FILE`).

A saved report needs only this much (more fields are allowed; what is missing gets the default below and the
source "default"):

    {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576,
               "memory_free_mib": 23900, "compute_capability": "8.6", "nvlink_peers": [1]}],
     "ram_total_mib": 65536, "ram_available_mib": 60000, "cpu_cores": 16}

Defaults: a GPU's `memory_free_mib` = its total; `memory_used_mib` = total - free; `name` "unknown GPU";
`compute_capability` None (unknown: the torch engine is not chosen for it); `nvlink_peers` []; `p2p_peers` =
its NVLink peers; `memory_bandwidth_gbps` from the known-GPU table by name, else None.  Machine: `ram_total_mib`
16384, `ram_available_mib` 75% of the total, `cpu_cores` 4, `cpu_threads` 2 x cores, `cpu_avx2` true,
`cpu_avx512` false, `ram_bandwidth_gbps` 25 (a typical dual-channel DDR4/DDR5 desktop), `disk_free_mib` null.
Peers that name a GPU not in the report are dropped with a note (the issue's one-GPU example lists peer 1).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hwprobe.errors import HardwareReportError
from hwprobe.gpus import known_bandwidth_gbps

SCHEMA = 1  # bump when the JSON form changes incompatibly
DEFAULT_RAM_BANDWIDTH_GBPS = 25.0  # unmeasured machines; this one reads ~32 GB/s (NOTES.md)


@dataclass(frozen=True)
class ProcessUse:
    pid: int  # a process holding memory on the GPU
    used_mib: int  # MiB it holds (0 when the driver does not say)


@dataclass(frozen=True)
class DecodeRecord:
    """A decode speed measured on this GPU (`hearth bench` keeps them per device: app/decode_records.py), which the
    planner prefers to its table of measured figures per GPU generation (hwprobe.decode_speed)."""

    engine: str  # "torch" | "llama.cpp"
    kind: str  # what the weights were: hwprobe.decode_speed.ENGINE_KINDS ("16bit", "int8", "int4", "fp8", "q6", "ggml")
    share: float  # of the GPU's peak bandwidth its weight reads reached at one stream (launch cost taken out)
    batch16: float = 1.0  # aggregate tokens/s at 16 streams over one stream's (1.0: not measured)
    source: str = ""  # what was run, and when


@dataclass(frozen=True)
class GpuInfo:
    index: int  # CUDA/NVML index
    name: str  # "NVIDIA GeForce RTX 3090"
    memory_total_mib: int
    memory_free_mib: int  # free now: what the planner plans against
    memory_used_mib: int = 0
    uuid: str = ""
    compute_capability: str | None = None  # "8.6"; None = unknown
    pcie_generation: int | None = None  # current link generation
    pcie_width: int | None = None  # current link width (lanes)
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs joined to this one by an active NVLink
    p2p_peers: tuple[int, ...] = ()  # indices this GPU can read directly (P2P read OK), NVLink included
    other_processes: tuple[ProcessUse, ...] = ()  # other programs holding memory on it
    memory_bandwidth_gbps: float | None = None  # peak, GB/s (known-GPU table); None = unknown
    sources: dict[str, str] = field(default_factory=dict)  # field name -> "nvml" | "torch.cuda" | ...
    decode_records: tuple[DecodeRecord, ...] = ()  # decode speeds measured on this GPU (best first)

    @property
    def cc(self) -> tuple[int, int] | None:
        """Compute capability as numbers, (8, 6); None when unknown."""
        if not self.compute_capability:
            return None
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)


@dataclass(frozen=True)
class HardwareReport:
    gpus: tuple[GpuInfo, ...]  # in index order; () = no NVIDIA GPU
    cpu_model: str
    cpu_cores: int  # physical
    cpu_threads: int  # logical
    cpu_avx2: bool
    cpu_avx512: bool
    ram_total_mib: int
    ram_available_mib: int  # what the planner may use for weights/KV kept in RAM
    ram_bandwidth_gbps: float = DEFAULT_RAM_BANDWIDTH_GBPS
    disk_free_mib: int | None = None  # free space at the model store; None = unknown
    disk_path: str | None = None  # where disk_free_mib was measured
    driver_version: str | None = None  # NVIDIA driver, "550.54.14"
    cuda_version: str | None = None  # highest CUDA the driver supports, "12.4"
    sources: dict[str, str] = field(default_factory=dict)  # field name -> where it came from
    notes: tuple[str, ...] = ()  # what the probe could not read, and why
    schema: int = SCHEMA

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


_GPU_DEFAULTS = {"name": "unknown GPU", "compute_capability": None, "nvlink_peers": [], "uuid": ""}
_MACHINE_DEFAULTS: dict[str, Any] = {
    "cpu_model": "unknown CPU",
    "cpu_cores": 4,
    "cpu_avx2": True,
    "cpu_avx512": False,
    "ram_total_mib": 16384,
    "ram_bandwidth_gbps": DEFAULT_RAM_BANDWIDTH_GBPS,
    "disk_free_mib": None,
    "disk_path": None,
    "driver_version": None,
    "cuda_version": None,
}


def _int(data: dict[str, Any], key: str, where: str, *, minimum: int = 0) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or value != int(value):
        raise HardwareReportError(
            f"{where}: {key} must be a whole number >= {minimum}, got {value!r}",
            "fix the file or write a new one with `hearth probe --json > FILE`",
        )
    return int(value)


def _gpu_from_dict(d: Any, pos: int) -> tuple[GpuInfo, list[str]]:
    where = f"gpus[{pos}]"
    if not isinstance(d, dict):
        raise HardwareReportError(f"{where} must be an object, got {d!r}", "see `hearth probe --json`")
    if "memory_total_mib" not in d:
        raise HardwareReportError(f"{where} has no memory_total_mib", "every GPU needs at least memory_total_mib")
    src = dict(d.get("sources") or {})
    notes: list[str] = []
    vals: dict[str, Any] = {"index": _int(d, "index", where) if "index" in d else pos}
    vals["memory_total_mib"] = _int(d, "memory_total_mib", where, minimum=1)
    vals["memory_free_mib"] = _int(d, "memory_free_mib", where) if "memory_free_mib" in d else vals["memory_total_mib"]
    if vals["memory_free_mib"] > vals["memory_total_mib"]:
        raise HardwareReportError(
            f"{where}: memory_free_mib {vals['memory_free_mib']} > memory_total_mib {vals['memory_total_mib']}",
            "free memory cannot exceed the total",
        )
    vals["memory_used_mib"] = (
        _int(d, "memory_used_mib", where)
        if "memory_used_mib" in d
        else vals["memory_total_mib"] - vals["memory_free_mib"]
    )
    for key, default in _GPU_DEFAULTS.items():
        vals[key] = d.get(key, default)
        if key not in d:
            src[key] = "default"
    if vals["compute_capability"] is not None:
        cc = str(vals["compute_capability"])
        if not cc.replace(".", "", 1).isdigit():
            raise HardwareReportError(
                f'{where}: compute_capability must look like "8.6", got {cc!r}',
                "see https://developer.nvidia.com/cuda-gpus",
            )
        vals["compute_capability"] = cc
    for key in ("pcie_generation", "pcie_width"):
        vals[key] = _int(d, key, where) if d.get(key) is not None else None
    vals["nvlink_peers"] = tuple(int(p) for p in vals["nvlink_peers"])
    vals["p2p_peers"] = tuple(int(p) for p in d.get("p2p_peers", vals["nvlink_peers"]))
    vals["other_processes"] = tuple(
        ProcessUse(int(p["pid"]), int(p.get("used_mib", 0))) for p in d.get("other_processes", ())
    )
    vals["decode_records"] = decode_records_from(d.get("decode_records") or [], where)
    bw = d.get("memory_bandwidth_gbps")
    if bw is None:
        bw = known_bandwidth_gbps(str(vals["name"]))
        src["memory_bandwidth_gbps"] = "known-gpus" if bw else "default"
    vals["memory_bandwidth_gbps"] = float(bw) if bw else None
    for key in (
        "index",
        "memory_total_mib",
        "memory_free_mib",
        "memory_used_mib",
        "name",
        "compute_capability",
        "nvlink_peers",
        "p2p_peers",
    ):
        src.setdefault(key, "hardware-file")
    return GpuInfo(**vals, sources=src), notes


def decode_records_from(raw: Any, where: str) -> tuple[DecodeRecord, ...]:
    """DecodeRecords from their JSON form (a list of objects); HardwareReportError naming the bad entry."""
    if not isinstance(raw, list):
        raise HardwareReportError(f"{where}: decode_records must be a list, got {raw!r}", "see `hearth probe --json`")
    out = []
    for i, r in enumerate(raw):
        try:
            share, batch16 = float(r["share"]), float(r.get("batch16", 1.0))
            rec = DecodeRecord(str(r["engine"]), str(r["kind"]), share, batch16, str(r.get("source", "")))
        except (KeyError, TypeError, ValueError):
            raise HardwareReportError(
                f"{where}: decode_records[{i}] needs engine, kind and share (a number), got {r!r}",
                "fix the entry or remove it",
            ) from None
        if not 0 < rec.share <= 1 or rec.batch16 < 1:
            raise HardwareReportError(
                f"{where}: decode_records[{i}]: share must be in (0, 1] and batch16 >= 1, got {rec.share}, "
                f"{rec.batch16}",
                "fix the entry or remove it",
            )
        out.append(rec)
    return tuple(out)


def report_from_dict(data: Any) -> HardwareReport:
    """A HardwareReport from its JSON form (full or minimal); HardwareReportError naming the bad field."""
    if not isinstance(data, dict):
        raise HardwareReportError(
            f"a hardware report must be a JSON object, got {type(data).__name__}",
            "write one with `hearth probe --json > FILE`",
        )
    if data.get("schema", SCHEMA) > SCHEMA:
        raise HardwareReportError(
            f"hardware report schema {data['schema']} is newer than this hearth ({SCHEMA})",
            "update hearth or write the file again with this version",
        )
    raw_gpus = data.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise HardwareReportError(f"gpus must be a list, got {raw_gpus!r}", "use [] for a machine without GPUs")
    gpus: list[GpuInfo] = []
    notes = list(data.get("notes", ()))
    for pos, g in enumerate(raw_gpus):
        gpu, gnotes = _gpu_from_dict(g, pos)
        gpus.append(gpu)
        notes += gnotes
    indices = {g.index for g in gpus}
    if len(indices) != len(gpus):
        raise HardwareReportError(f"GPU indices repeat: {[g.index for g in gpus]}", "give each GPU its own index")
    cleaned = []
    for g in sorted(gpus, key=lambda g: g.index):
        missing = sorted(set(g.nvlink_peers + g.p2p_peers) - indices)
        if missing:
            notes.append(f"GPU {g.index} lists peers {missing} that are not in the report; ignored")
        cleaned.append(
            GpuInfo(
                **{
                    **{f.name: getattr(g, f.name) for f in fields(g)},
                    "nvlink_peers": tuple(p for p in g.nvlink_peers if p in indices),
                    "p2p_peers": tuple(p for p in g.p2p_peers if p in indices),
                }
            )
        )
    src = dict(data.get("sources") or {})
    vals: dict[str, Any] = {}
    for key, default in _MACHINE_DEFAULTS.items():
        vals[key] = data.get(key, default)
        src.setdefault(key, "hardware-file" if key in data else "default")
    for key in ("cpu_cores", "ram_total_mib"):
        vals[key] = _int({key: vals[key]}, key, "hardware report", minimum=1)
    vals["cpu_threads"] = (
        _int(data, "cpu_threads", "hardware report", minimum=1) if "cpu_threads" in data else 2 * vals["cpu_cores"]
    )
    src.setdefault("cpu_threads", "hardware-file" if "cpu_threads" in data else "default")
    vals["ram_available_mib"] = (
        _int(data, "ram_available_mib", "hardware report")
        if "ram_available_mib" in data
        else vals["ram_total_mib"] * 3 // 4
    )
    src.setdefault("ram_available_mib", "hardware-file" if "ram_available_mib" in data else "default")
    vals["ram_bandwidth_gbps"] = float(vals["ram_bandwidth_gbps"])
    return HardwareReport(gpus=tuple(cleaned), **vals, sources=src, notes=tuple(notes))


def with_memory_back(report: HardwareReport, pids: frozenset[int], ram_mib: int = 0) -> HardwareReport:
    """The report as if the processes `pids` held none of their GPU memory and `ram_mib` more RAM were
    available: hearth's own runners that the command will reuse (backends/runner/resident.py), whose memory the
    plan must count as the model's, not as taken, or it would plan another load than the one they hold."""
    if not pids and not ram_mib:
        return report
    gpus = []
    for g in report.gpus:
        back = sum(p.used_mib for p in g.other_processes if p.pid in pids)
        gpus.append(
            replace(
                g,
                memory_free_mib=min(g.memory_total_mib, g.memory_free_mib + back),
                memory_used_mib=max(0, g.memory_used_mib - back),
                other_processes=tuple(p for p in g.other_processes if p.pid not in pids),
            )
        )
    ram = min(report.ram_total_mib, report.ram_available_mib + ram_mib)
    return replace(report, gpus=tuple(gpus), ram_available_mib=ram)


def with_memory_taken(report: HardwareReport, taken: Iterable[Any]) -> HardwareReport:
    """The report as if `taken` (plan_types.DeviceMemory of plans already loaded: kind "gpu" with its index, or
    "cpu" for host RAM) were in use: a server planning one more model beside the ones it has loaded, whose
    plans are what their engines allocated (app/server/pool.py)."""
    gpu_mib: dict[int, int] = {}
    ram_mib = 0
    for d in taken:
        if d.kind == "gpu" and d.index is not None:
            gpu_mib[d.index] = gpu_mib.get(d.index, 0) + d.total_mib
        elif d.kind == "cpu":
            ram_mib += d.total_mib
    if not gpu_mib and not ram_mib:
        return report
    gpus = tuple(
        replace(
            g,
            memory_free_mib=max(0, g.memory_free_mib - gpu_mib.get(g.index, 0)),
            memory_used_mib=min(g.memory_total_mib, g.memory_used_mib + gpu_mib.get(g.index, 0)),
        )
        for g in report.gpus
    )
    return replace(report, gpus=gpus, ram_available_mib=max(0, report.ram_available_mib - ram_mib))


def load_report(path: str | Path) -> HardwareReport:
    """Read a saved HardwareReport (`hearth probe --json > FILE`)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise HardwareReportError(
            f"cannot read hardware file {p}: {exc.strerror or exc}", "write one with `hearth probe --json > FILE`"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareReportError(
            f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}", "write one with `hearth probe --json > FILE`"
        ) from None
    return report_from_dict(data)
