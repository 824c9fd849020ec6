"""probe(): measure this machine into a HardwareReport (never decides anything; see planner.py for that).

Sources, in order: NVML for NVIDIA GPUs; torch.cuda only when NVML is unusable but an NVIDIA driver is present
(/proc/driver/nvidia/version exists), so a GPU-less machine never pays for importing torch; /proc/cpuinfo for the
CPU model and AVX flags; psutil for cores, RAM and free disk.  Whatever cannot be read is left at a default and
said in `notes`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from hwprobe.gpus import known_bandwidth_gbps
from hwprobe.nvml import MIB, NvmlResult, read_nvml
from hwprobe.report import DEFAULT_RAM_BANDWIDTH_GBPS, GpuInfo, HardwareReport

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")
CPUINFO_FILE = Path("/proc/cpuinfo")


def read_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo text."""
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _torch_cuda_gpus() -> tuple[GpuInfo, ...]:
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        return ()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        peers = tuple(j for j in range(torch.cuda.device_count()) if j != i and torch.cuda.can_device_access_peer(i, j))
        bw = known_bandwidth_gbps(props.name)
        gpus.append(
            GpuInfo(
                index=i,
                name=props.name,
                memory_total_mib=total // MIB,
                memory_free_mib=free // MIB,
                memory_used_mib=(total - free) // MIB,
                compute_capability=f"{props.major}.{props.minor}",
                p2p_peers=peers,
                memory_bandwidth_gbps=bw,
                sources={
                    **{
                        k: "torch.cuda"
                        for k in (
                            "index",
                            "name",
                            "memory_total_mib",
                            "memory_free_mib",
                            "memory_used_mib",
                            "compute_capability",
                            "p2p_peers",
                        )
                    },
                    "memory_bandwidth_gbps": "known-gpus" if bw else "default",
                },
            )
        )
    return tuple(gpus)


def _gpus(notes: list[str]) -> tuple[NvmlResult, str | None]:
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        nvml = None
        notes.append("nvidia-ml-py (pynvml) is not installed")
    result = read_nvml(nvml) if nvml else None
    if result is not None:
        return result, "nvml"
    if nvml is not None:
        notes.append("NVML could not start (no NVIDIA driver library)")
    if not NVIDIA_DRIVER_FILE.exists():
        notes.append("no NVIDIA driver: no GPUs")
        return NvmlResult((), None, None), None
    try:
        gpus = _torch_cuda_gpus()
    except Exception as exc:  # noqa: BLE001 - any torch failure only means "no second source"
        notes.append(f"torch.cuda fallback failed: {exc!r}")
        gpus = ()
    driver = NVIDIA_DRIVER_FILE.read_text(errors="replace").split("Kernel Module")[-1].split()[:1]
    return NvmlResult(gpus, driver[0] if driver else None, None), "torch.cuda"


def probe(model_dir: str | os.PathLike[str] | None = None) -> HardwareReport:
    """Measure this machine.  `model_dir` is where models are stored (free disk is measured there)."""
    import psutil  # lazy: keeps `hearth --help` light (+psutil)

    notes: list[str] = []
    src: dict[str, Any] = {}
    nv, gpu_source = _gpus(notes)
    if gpu_source:
        src.update(driver_version=gpu_source, cuda_version=gpu_source)
    try:
        model, flags = read_cpuinfo(CPUINFO_FILE.read_text(errors="replace"))
        src.update(cpu_model="/proc/cpuinfo", cpu_avx2="/proc/cpuinfo", cpu_avx512="/proc/cpuinfo")
    except OSError:
        import platform  # lazy: keeps `hearth --help` light (+platform)

        model, flags = platform.processor() or None, set()
        notes.append("no /proc/cpuinfo: CPU flags unknown")
        src.update(cpu_model="platform", cpu_avx2="default", cpu_avx512="default")
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    vm = psutil.virtual_memory()
    src.update(
        cpu_cores="psutil",
        cpu_threads="psutil",
        ram_total_mib="psutil",
        ram_available_mib="psutil",
        ram_bandwidth_gbps="default",
    )
    disk_free = None
    disk_path = None
    if model_dir is not None:
        p = Path(model_dir)
        while not p.exists() and p != p.parent:  # the store folder may not exist yet: measure its parent
            p = p.parent
        disk_path = str(p)
        try:
            disk_free = psutil.disk_usage(str(p)).free // MIB
            src["disk_free_mib"] = "psutil"
        except OSError as exc:
            notes.append(f"free disk at {p} unknown: {exc}")
    return HardwareReport(
        gpus=nv.gpus,
        cpu_model=model or "unknown CPU",
        cpu_cores=physical,
        cpu_threads=logical,
        cpu_avx2="avx2" in flags,
        cpu_avx512="avx512f" in flags,
        ram_total_mib=vm.total // MIB,
        ram_available_mib=vm.available // MIB,
        ram_bandwidth_gbps=DEFAULT_RAM_BANDWIDTH_GBPS,
        disk_free_mib=disk_free,
        disk_path=disk_path,
        driver_version=nv.driver_version,
        cuda_version=nv.cuda_version,
        sources=src,
        notes=tuple(notes),
    )
