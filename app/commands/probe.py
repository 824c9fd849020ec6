"""`hearth probe [--json]`: what this machine has (GPUs, CPU, RAM, disk) and where each number came from."""

from __future__ import annotations

import argparse

from app.commands.common import HARDWARE

NAME = "probe"
HELP = "show this machine's GPUs, CPU, RAM and free disk (the planner's input)"
ORDER = 60
DESCRIPTION = """Show what hearth sees on this machine: NVIDIA GPUs through NVML (memory free and used, what
other programs hold, compute capability, PCIe, NVLink and P2P), the CPU and its AVX flags, RAM, and free disk at
the model store.  Each figure says where it came from (nvml, torch.cuda, psutil, /proc/cpuinfo, default).

  hearth probe                    a table
  hearth probe --json > my.json   a HardwareReport; plan for it anywhere with `--hardware my.json`"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the HardwareReport as JSON")
    HARDWARE.add(p, help="show a saved HardwareReport instead of probing")


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import hardware_report
    from hwprobe.render import report_text  # lazy: keeps `hearth --help` light (+1 hearth modules)

    report = hardware_report(args.hardware)
    print(report.to_json() if args.json else report_text(report))
    return 0
