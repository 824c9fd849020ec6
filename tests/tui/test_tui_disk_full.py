"""A full disk under the conversations database (issue 43 item 2): the store refuses the write and keeps what it
had (app/conversations.py), and the chat app says so, keeps a refused message in the prompt box, keeps a refused
reply on screen and in memory, and saves it once there is room."""

from __future__ import annotations

import pytest

import app.unsaved_replies as unsaved
from app.conversations import ConversationStore, StoreFullError
from tests.tui.conftest import chat_text, wait_for

pytestmark = pytest.mark.tui


def _fill(store: ConversationStore) -> None:
    """No room for another page: SQLite answers SQLITE_FULL, as on a full disk."""
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")


def _make_room(store: ConversationStore) -> None:
    store._conn.execute("PRAGMA max_page_count = 1073741823")


def test_the_store_refuses_a_write_on_a_full_disk_and_keeps_what_it_had(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ConversationStore.open(tmp_path / "c.db")
    conv = store.create()
    store.add_message(conv.id, "user", "saved before")
    _fill(store)
    with pytest.raises(StoreFullError, match="full: this was not saved"):
        store.add_message(conv.id, "assistant", "x" * 200_000)
    assert [m.content for m in store.get(conv.id).messages] == ["saved before"]
    _make_room(store)
    store.add_message(conv.id, "assistant", "x" * 200_000)
    assert [len(m.content) for m in store.get(conv.id).messages] == [12, 200_000]
    store.close()
    reopened = ConversationStore.open(tmp_path / "c.db")
    assert len(reopened.get(conv.id).messages) == 2


async def test_the_chat_app_keeps_a_refused_message_and_a_refused_reply(make_app, backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(unsaved, "RETRY_S", 0.2)
    monkeypatch.setattr("app.tui.app.RETRY_S", 0.2)
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        _fill(app.store)
        app.prompt_box.load_text("y" * 300_000)  # more than the last page holds
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(n.title == "not sent" for n in app._notifications))
        assert app.prompt_box.text == "y" * 300_000 and app.turn is None  # kept, not sent
        _make_room(app.store)

        real = app.store.add_message
        full = {"on": True}

        def refuse_replies(conversation_id, role, content, stats=None):  # type: ignore[no-untyped-def]
            if role == "assistant" and full["on"]:
                raise StoreFullError("the disk holding the conversations database is full: this was not saved")
            return real(conversation_id, role, content, stats)

        app.store.add_message = refuse_replies  # type: ignore[method-assign]
        app.prompt_box.load_text("hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(n.title == "not saved yet" for n in app._notifications))
        assert chat_text(app)[-1][0] == "assistant" and app.unsaved.waiting  # on screen, waiting in memory
        assert [m.role for m in app.store.get(app.conv.id).messages][-1] == "user"
        full["on"] = False  # room again: the retry saves it
        await wait_for(pilot, lambda: not app.unsaved.waiting)
        messages = app.store.get(app.conv.id).messages
        assert [m.role for m in messages][-2:] == ["user", "assistant"]
        assert messages[-1].content == backend.replies[0]
        assert any(n.title == "saved" for n in app._notifications)
