"""Small modal prompts: a line of text (rename), yes/no (delete)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class AskText(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.question, markup=False, classes="title")
            yield Input(self.value, id="answer")
            yield Static("Enter to confirm, Esc to cancel", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


class Confirm(ModalScreen[bool]):
    BINDINGS = [Binding("y", "dismiss(True)", "yes"), Binding("n,escape", "dismiss(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.question, markup=False, classes="title")
            yield Static("y = yes, n / Esc = no", classes="hint")
