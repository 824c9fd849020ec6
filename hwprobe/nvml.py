"""NVIDIA GPUs through NVML (PyPI nvidia-ml-py, module `pynvml`), the probe's first source.

`read_nvml(nvml)` takes the module as an argument so tests pass a fake one; `probe()` imports the real one
lazily.  Any NVML failure at init (no library, no driver) means "no NVML": the caller falls back or reports no
GPUs.  Failures of optional queries (NVLink on cards without it, PCIe on some laptops) leave that field empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hwprobe.gpus import known_bandwidth_gbps
from hwprobe.report import GpuInfo, ProcessUse

MIB = 1024 * 1024
_NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS in current drivers


@dataclass(frozen=True)
class NvmlResult:
    gpus: tuple[GpuInfo, ...]  # in index order
    driver_version: str | None  # "550.54.14"
    cuda_version: str | None  # highest CUDA the driver supports, "12.4"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Callable[[], Any], nvml: ModuleType) -> Any:
    """The value of an optional NVML query, or None when this GPU or driver does not support it."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _processes(nvml: ModuleType, handle: Any) -> tuple[ProcessUse, ...]:
    seen: dict[int, int] = {}
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nvml, query, None)
        procs = _optional(lambda: fn(handle), nvml) if fn else None
        for p in procs or ():
            used = getattr(p, "usedGpuMemory", None)
            seen[int(p.pid)] = max(seen.get(int(p.pid), 0), int(used) // MIB if used else 0)
    me = os.getpid()
    return tuple(ProcessUse(pid, mib) for pid, mib in sorted(seen.items()) if pid != me)


def _nvlink_bus_ids(nvml: ModuleType, handle: Any) -> set[str]:
    """PCI bus ids of the devices at the far end of this GPU's active NVLinks."""
    peers: set[str] = set()
    for link in range(_NVLINK_MAX_LINKS):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            peers.add(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower())
        except nvml.NVMLError:  # NotSupported on cards without NVLink; InvalidArgument past the last link
            break
    return peers


# the GpuInfo fields read_nvml reads from NVML (its sources say so)
_NVML_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory_total_mib",
    "memory_free_mib",
    "memory_used_mib",
    "compute_capability",
    "pcie_generation",
    "pcie_width",
    "nvlink_peers",
    "p2p_peers",
    "other_processes",
)


def read_nvml(nvml: ModuleType) -> NvmlResult | None:
    """Every NVIDIA GPU NVML sees, or None when NVML cannot start (no library or no driver)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        driver = _optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()), nvml)
        cuda = _cuda_version(nvml)
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_ids = [
            (_optional(lambda h=h: _text(nvml.nvmlDeviceGetPciInfo(h).busId), nvml) or "").lower() for h in handles
        ]
        gpus = tuple(_gpu_info(nvml, i, handles, bus_ids) for i in range(len(handles)))
        return NvmlResult(gpus, driver, cuda)
    finally:
        _optional(nvml.nvmlShutdown, nvml)


def _cuda_version(nvml: ModuleType) -> str | None:
    """The highest CUDA the driver supports, "12.4" (NVML says 12040), or None when it does not say."""
    cuda_int = _optional(nvml.nvmlSystemGetCudaDriverVersion, nvml)
    return f"{cuda_int // 1000}.{cuda_int % 1000 // 10}" if cuda_int else None


def _gpu_info(nvml: ModuleType, i: int, handles: list[Any], bus_ids: list[str]) -> GpuInfo:
    """GPU i (handles[i]) as NVML reports it; its NVLink peers found by the PCI bus ids of all GPUs (bus_ids)."""
    h = handles[i]
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    cc = _optional(lambda: nvml.nvmlDeviceGetCudaComputeCapability(h), nvml)
    name = _text(nvml.nvmlDeviceGetName(h))
    links = _nvlink_bus_ids(nvml, h)
    nvlink = tuple(j for j, b in enumerate(bus_ids) if j != i and b and b in links)
    p2p = _p2p_peers(nvml, i, handles)
    bw = known_bandwidth_gbps(name)
    return GpuInfo(
        index=i,
        name=name,
        uuid=_optional(lambda: _text(nvml.nvmlDeviceGetUUID(h)), nvml) or "",
        memory_total_mib=int(mem.total) // MIB,
        memory_free_mib=int(mem.free) // MIB,
        memory_used_mib=int(mem.used) // MIB,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        pcie_generation=_optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h), nvml),
        pcie_width=_optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h), nvml),
        nvlink_peers=nvlink,
        p2p_peers=tuple(sorted(set(p2p) | set(nvlink))),
        other_processes=_processes(nvml, h),
        memory_bandwidth_gbps=bw,
        sources={
            "memory_bandwidth_gbps": "known-gpus" if bw else "default",
            **dict.fromkeys(_NVML_FIELDS, "nvml"),
        },
    )


def _p2p_peers(nvml: ModuleType, i: int, handles: list[Any]) -> tuple[int, ...]:
    """The other GPUs GPU i can read from peer to peer (NVML's P2P status for reads is OK)."""
    h = handles[i]
    read_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
    status_ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    return tuple(
        j
        for j, other in enumerate(handles)
        if j != i and _optional(lambda other=other: nvml.nvmlDeviceGetP2PStatus(h, other, read_caps), nvml) == status_ok
    )
