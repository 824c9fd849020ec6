"""HardwareReport JSON (minimal form, defaults, errors, round trip) and the NVML reader against a fake pynvml."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from hwprobe.errors import HardwareReportError
from hwprobe.nvml import MIB, read_nvml
from hwprobe.probe import probe, read_cpuinfo
from hwprobe.report import load_report, report_from_dict

MINIMAL = {
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA GeForce RTX 3090",
            "memory_total_mib": 24576,
            "memory_free_mib": 23900,
            "compute_capability": "8.6",
            "nvlink_peers": [1],
        }
    ],
    "ram_total_mib": 65536,
    "ram_available_mib": 60000,
    "cpu_cores": 16,
}


def test_minimal_form_from_the_issue_gets_documented_defaults(tmp_path: Path) -> None:
    f = tmp_path / "hw.json"
    f.write_text(json.dumps(MINIMAL))
    r = load_report(f)
    g = r.gpus[0]
    assert (g.memory_free_mib, g.memory_used_mib, g.cc) == (23900, 676, (8, 6))
    assert g.nvlink_peers == () and any("peers [1]" in n for n in r.notes)  # no GPU 1 in the report
    assert g.memory_bandwidth_gbps == 936 and g.sources["memory_bandwidth_gbps"] == "known-gpus"
    assert g.sources["memory_free_mib"] == "hardware-file"
    assert (r.cpu_threads, r.cpu_avx2, r.cpu_avx512) == (32, True, False)
    assert r.sources["cpu_threads"] == "default" and r.sources["ram_total_mib"] == "hardware-file"


def test_report_round_trips_through_json() -> None:
    r = probe("/tmp")
    again = report_from_dict(json.loads(r.to_json()))
    assert again.as_dict() | {"sources": {}} == r.as_dict() | {"sources": {}}
    assert r.sources.items() <= again.sources.items()  # the probe's sources survive; the rest say hardware-file


@pytest.mark.parametrize(
    "bad,match",
    [
        ([], "must be a JSON object"),
        ({"gpus": [{"name": "x"}]}, "no memory_total_mib"),
        ({"gpus": [{"memory_total_mib": 100, "memory_free_mib": 200}]}, "cannot exceed|> memory_total_mib"),
        ({"gpus": [{"memory_total_mib": "lots"}]}, "whole number"),
        ({"gpus": [{"memory_total_mib": 100, "compute_capability": "ampere"}]}, "compute_capability"),
        ({"gpus": [{"index": 0, "memory_total_mib": 1}, {"index": 0, "memory_total_mib": 1}]}, "indices repeat"),
        ({"cpu_cores": 0}, "cpu_cores"),
    ],
)
def test_bad_reports_name_the_field(bad, match: str) -> None:
    with pytest.raises(HardwareReportError, match=match):
        report_from_dict(bad)


def test_unreadable_file_is_a_hardware_report_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareReportError, match="cannot read"):
        load_report(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(HardwareReportError, match="not valid JSON"):
        load_report(tmp_path / "bad.json")


def test_cpuinfo_flags() -> None:
    model, flags = read_cpuinfo(
        "processor\t: 0\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu avx2 avx512f\n"
        "processor\t: 1\nmodel name\t: other\n"
    )
    assert model == "AMD EPYC 9654" and {"avx2", "avx512f"} <= flags


# -- a fake NVML: two RTX 3090s joined by NVLink, GPU 1 with another process holding 6 GiB -------------------
class FakeNVMLError(Exception):
    pass


@dataclass
class Mem:
    total: int
    free: int
    used: int


def fake_nvml(*, init_fails: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_P2P_CAPS_INDEX_READ = 0
    nv.NVML_P2P_STATUS_OK = 0
    bus = ["00000000:01:00.0", "00000000:02:00.0"]
    used = [300 * MIB, 6444 * MIB]

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvlink_state(h: int, link: int) -> int:
        if link >= 4:
            raise FakeNVMLError("Invalid Argument")
        return 1

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.14"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12040
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 3090"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    nv.nvmlDeviceGetMemoryInfo = lambda h: Mem(24576 * MIB, 24576 * MIB - used[h], used[h])
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 6)
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetNvLinkState = nvlink_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=bus[1 - h])
    nv.nvmlDeviceGetP2PStatus = lambda a, b, caps: 0

    def procs(h: int):
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=6144 * MIB)] if h == 1 else []

    nv.nvmlDeviceGetComputeRunningProcesses = procs

    def no_graphics(h: int):
        raise FakeNVMLError("Not Supported")

    nv.nvmlDeviceGetGraphicsRunningProcesses = no_graphics
    return nv


def test_nvml_reader_against_a_fake_module() -> None:
    res = read_nvml(fake_nvml())
    assert res is not None and (res.driver_version, res.cuda_version) == ("550.54.14", "12.4")
    g0, g1 = res.gpus
    assert (g0.name, g0.uuid, g0.compute_capability, g0.pcie_generation, g0.pcie_width) == (
        "NVIDIA GeForce RTX 3090",
        "GPU-0",
        "8.6",
        4,
        16,
    )
    assert (g0.nvlink_peers, g0.p2p_peers, g1.nvlink_peers) == ((1,), (1,), (0,))
    assert (g1.memory_total_mib, g1.memory_free_mib, g1.memory_used_mib) == (24576, 18132, 6444)
    assert [(p.pid, p.used_mib) for p in g1.other_processes] == [(4242, 6144)]
    assert g0.sources["memory_free_mib"] == "nvml"


def test_nvml_without_nvlink_support() -> None:
    nv = fake_nvml()

    def unsupported(h: int, link: int) -> int:
        raise FakeNVMLError("Not Supported")

    nv.nvmlDeviceGetNvLinkState = unsupported
    nv.nvmlDeviceGetP2PStatus = lambda a, b, caps: 2  # not supported
    g0, _ = read_nvml(nv).gpus
    assert g0.nvlink_peers == () and g0.p2p_peers == ()


def test_probe_uses_nvml_and_carries_on_without_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    r = probe(tmp_path)
    assert len(r.gpus) == 2 and r.sources["driver_version"] == "nvml"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_fails=True))
    monkeypatch.setattr(sys.modules["hwprobe.probe"], "NVIDIA_DRIVER_FILE", tmp_path / "no-driver")
    r = probe(tmp_path)
    assert r.gpus == () and any("no NVIDIA driver" in n for n in r.notes)
    assert r.disk_free_mib and r.disk_free_mib > 0 and r.ram_total_mib > 0
