"""F5: what hwprobe.probe() found on this machine (with where each figure came from) and the loaded model's
plan reasons.  Probing runs in a thread worker."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def format_report(report: Any) -> str:
    lines = [f"CPU: {report.cpu_model}, {report.cpu_cores} cores / {report.cpu_threads} threads"
             f"{', AVX2' if report.cpu_avx2 else ''}{', AVX-512' if report.cpu_avx512 else ''}",
             f"RAM: {report.ram_available_mib} MiB available of {report.ram_total_mib} MiB"]
    if report.disk_free_mib is not None:
        lines.append(f"Disk: {report.disk_free_mib} MiB free at {report.disk_path}")
    if not report.gpus:
        lines.append("GPUs: none found")
    for g in report.gpus:
        link = f", PCIe gen {g.pcie_generation} x{g.pcie_width}" if g.pcie_generation else ""
        lines.append(f"GPU {g.index}: {g.name}, {g.memory_free_mib} MiB free of {g.memory_total_mib} MiB, "
                     f"compute {g.compute_capability or '?'}{link}")
    if report.driver_version:
        lines.append(f"Driver {report.driver_version}, CUDA {report.cuda_version or '?'}")
    if report.sources:
        lines.append("Sources: " + ", ".join(f"{k} from {v}" for k, v in sorted(report.sources.items())))
    lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines)


def format_plan(decision: Any | None) -> str:
    if decision is None:
        return "No model loaded yet."
    o = decision.options
    lines = [f"Backend {decision.backend}, context {o.n_ctx}, GPU layers {o.n_gpu_layers}"]
    speed = getattr(decision.plan, "expected_tokens_per_s", None) if decision.plan is not None else None
    if speed:
        lines.append(f"Expected about {speed:.0f} tokens/s")
    lines += [f"- {r}" for r in decision.reasons]
    return "\n".join(lines)


class HardwareScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f5,q", "dismiss", "close")]

    def __init__(self, decision: Any | None) -> None:
        super().__init__()
        self.decision = decision

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Static("Hardware  (Esc closes)", classes="title")
            yield Static("probing...", id="report", markup=False)
            yield Static("Plan for the loaded model", classes="title")
            yield Static(format_plan(self.decision), id="plan", markup=False)

    def on_mount(self) -> None:
        self.probe()

    @work(thread=True, exclusive=True)
    def probe(self) -> None:
        try:
            from hwprobe.probe import probe

            text = format_report(probe())
        except Exception as exc:  # the screen says what failed instead of crashing the app
            text = f"probe failed: {exc}"
        self.app.call_from_thread(self.query_one("#report", Static).update, text)
