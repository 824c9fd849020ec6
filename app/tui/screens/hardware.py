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

from hwprobe.probe import probe
from hwprobe.render import report_text


def format_plan(decision: Any | None) -> str:
    if decision is None:
        return "No model loaded yet."
    o = decision.options
    if decision.backend == "remote":  # no plan and no local placement: the server decided those
        return "\n".join(["Backend remote: the model runs on its server", *[f"- {r}" for r in decision.reasons]])
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
            text = report_text(probe())  # the same text as `hearth probe`
        except Exception as exc:  # noqa: BLE001 - the screen says what failed instead of crashing the app
            text = f"probe failed: {exc}"
        self.app.call_from_thread(self.query_one("#report", Static).update, text)
