"""The conversation list with a search box.  Selecting one posts Sidebar.Open; the App does the rest."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, ListItem, ListView, Static


class ConversationItem(ListItem):
    def __init__(self, conversation_id: int, title: str) -> None:
        super().__init__(Static(title or "New conversation", markup=False))
        self.conversation_id = conversation_id


class Sidebar(Vertical):
    @dataclass
    class Open(Message):
        conversation_id: int

    @dataclass
    class Search(Message):
        query: str

    def compose(self) -> ComposeResult:
        yield Input(placeholder="search (Ctrl+F)", id="search")
        yield ListView(id="conversations")

    async def show(self, items: list[tuple[int, str]], current: int | None) -> None:
        lv = self.query_one(ListView)
        await lv.clear()
        await lv.extend([ConversationItem(i, t) for i, t in items])
        ids = [i for i, _ in items]
        if current in ids:
            lv.index = ids.index(current)

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ConversationItem):
            self.post_message(self.Open(event.item.conversation_id))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Search(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(ListView).focus()
