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


NAMES = {"escape": "Esc", "question_mark": "?", "enter": "Enter", "up": "Up", "tab": "Tab"}


def key_label(key: str) -> str:
    """'ctrl+r' -> 'Ctrl+R', 'f10' -> 'F10', 'escape' -> 'Esc'."""
    parts = key.strip().split("+")
    *mods, last = parts
    last = NAMES.get(last, last.upper() if len(last) == 1 or last[0] == "f" else last.capitalize())
    return "+".join([m.capitalize() for m in mods] + [last])


def binding_rows(bindings: list[Binding]) -> list[tuple[str, str]]:
    return [(" / ".join(key_label(k) for k in b.key.split(",")), b.description) for b in bindings]


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
