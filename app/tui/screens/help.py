"""F1 / ?: every key binding, taken from the App's own BINDINGS so the list cannot go stale."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

EXTRA = [
    ("Enter", "send the prompt"),
    ("Ctrl+J / Shift+Enter", "new line in the prompt"),
    ("Up (empty prompt)", "edit the last message you sent"),
    ("Tab / Shift+Tab", "move focus (prompt, messages, sidebar)"),
    ("e (on a message)", "edit that message and resend from there"),
    ("c (on a message)", "copy that message (OSC 52)"),
    ("Ctrl+Q", "quit"),
]


def binding_rows(bindings: list[Binding]) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        keys = " / ".join(k.strip().replace("ctrl+", "Ctrl+").replace("escape", "Esc").upper()
                          if k.strip().startswith("f") and k.strip()[1:].isdigit()
                          else k.strip().replace("ctrl+", "Ctrl+").replace("escape", "Esc")
                          for k in b.key.split(","))
        rows.append((keys, b.description))
    return rows


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q,question_mark", "dismiss", "close")]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self.rows = binding_rows(bindings) + EXTRA

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in self.rows) + 2
        text = "\n".join(f"{k:<{width}}{d}" for k, d in self.rows)
        with VerticalScroll(id="dialog"):
            yield Static("Keys  (Esc closes)", classes="title")
            yield Static(text, markup=False)
