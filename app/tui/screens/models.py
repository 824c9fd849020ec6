"""F4: the model picker.  Local models with size, quant and what hearth would do with each on this machine
(the Decision from app.loading.decide: backend, context, GPU layers, expected speed, reasons).  The plans are
computed in a thread worker, so the list opens at once even when reading headers or probing takes a moment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from app.loading import decide
from app.store import ModelStore


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def model_row(entry: Any, spec: Any, decision: Any) -> tuple[str, ...]:
    """One table row; `decision.plan` may be None (no planner result), the row says so instead of guessing."""
    plan = getattr(decision, "plan", None)
    speed = getattr(plan, "expected_tokens_per_s", None)
    ngl = decision.options.n_gpu_layers
    return (
        entry.name,
        _gib(spec.file_size_bytes),
        spec.file_type,
        decision.backend,
        str(decision.options.n_ctx),
        "all" if ngl == -1 else str(ngl),
        f"{speed:.0f}" if speed else "?",
    )


def plan_rows(settings: Any) -> tuple[list[tuple[str, ...]], dict[str, list[str]]]:
    """(rows, reasons by model name) for every local model; unreadable ones get a row that says why."""
    store = ModelStore()
    rows, reasons = [], {}
    for entry in store.entries():
        try:
            spec = store.spec_for_path(Path(entry.path))
            decision = decide(spec, settings.merged(model=entry.name))
            rows.append(model_row(entry, spec, decision))
            reasons[entry.name] = list(decision.reasons)
        except Exception as exc:  # noqa: BLE001 - one broken file must not hide the others
            rows.append((entry.name, "?", "?", "unreadable", "", "", ""))
            reasons[entry.name] = [str(exc)]
    return rows, reasons


class ModelPicker(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]
    COLUMNS = ("model", "size", "quant", "backend", "context", "GPU layers", "tok/s")

    def __init__(self, settings: Any, current: str | None) -> None:
        super().__init__()
        self.settings, self.current = settings, current
        self.reasons: dict[str, list[str]] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static("Models  (Enter loads, Esc cancels)", classes="title")
            yield DataTable(id="models", cursor_type="row")
            yield Static("reading models and planning...", id="reasons", markup=False)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*self.COLUMNS)
        self.plan()

    @work(thread=True, exclusive=True)
    def plan(self) -> None:
        rows, reasons = plan_rows(self.settings)
        self.app.call_from_thread(self.show, rows, reasons)

    def show(self, rows: list[tuple[str, ...]], reasons: dict[str, list[str]]) -> None:
        self.reasons = reasons
        table = self.query_one(DataTable)
        for row in rows:
            table.add_row(*row, key=row[0])
        names = [r[0] for r in rows]
        if self.current in names:
            table.move_cursor(row=names.index(self.current))
        table.focus()
        self._show_reasons(self.current if self.current in names else (names[0] if names else None))

    def _show_reasons(self, name: str | None) -> None:
        text = "\n".join(f"- {r}" for r in self.reasons.get(name or "", [])) or "no models found"
        self.query_one("#reasons", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_reasons(event.row_key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)
