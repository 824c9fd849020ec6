"""The conversation view: one MessageBox (Markdown) per message; the last reply streams into its box."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownStream


class MessageBox(Markdown):
    """One message.  Focus it (click, or Tab) and press e to edit-and-resend from it, c to copy it."""

    BINDINGS = [Binding("e", "edit", "edit from here"), Binding("c", "copy", "copy message")]
    can_focus = True

    @dataclass
    class Edit(Message):
        position: int

    @dataclass
    class Copy(Message):
        text: str

    def __init__(self, role: str, text: str, position: int | None) -> None:
        super().__init__(text, classes=role)
        self.role = role
        self.text = text
        self.position = position  # None while the reply streams (not saved yet)
        self.border_title = "you" if role == "user" else "assistant"
        self._stream: MarkdownStream | None = None

    async def add_text(self, fragment: str) -> None:
        if self._stream is None:
            self._stream = Markdown.get_stream(self)
        self.text += fragment
        await self._stream.write(fragment)

    async def finish(self, note: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if note:
            self.border_subtitle = note

    def action_edit(self) -> None:
        if self.role == "user" and self.position is not None:
            self.post_message(self.Edit(self.position))

    def action_copy(self) -> None:
        self.post_message(self.Copy(self.text))


class ChatLog(VerticalScroll):
    can_focus = False

    async def show(self, messages: list[tuple[str, str, int | None, str]]) -> None:
        """(role, text, position, note) per message; the note goes under the box ("stopped")."""
        await self.remove_children()
        boxes = [MessageBox(role, text, pos) for role, text, pos, _ in messages]
        for box, (*_, note) in zip(boxes, messages):
            box.border_subtitle = note
        await self.mount_all(boxes)
        self.scroll_end(animate=False)

    async def add(self, role: str, text: str, position: int | None) -> MessageBox:
        box = MessageBox(role, text, position)
        await self.mount(box)
        self.scroll_end(animate=False)
        return box

    def boxes(self) -> list[MessageBox]:
        return list(self.query(MessageBox))
