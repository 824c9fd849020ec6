"""The prompt box: a multi-line TextArea where Enter sends and Ctrl+J (or Shift+Enter) inserts a newline."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptBox(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class EditLast(Message):
        """Up in an empty box: edit the last message you sent."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)  # type: ignore[arg-type]

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
            return
        if event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLast())
            return
        await super()._on_key(event)
