"""The soak's chat stand-in (app/soak_chat.py) against a live server on a fake engine, with the disk under its
store really filled for a moment (app/soak_disk.py): the reply that arrives on the full disk and the message typed
then are refused with StoreFullError, kept, and saved once there is room; a fresh open of the store holds every
message in order (lost 0)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

import app.soak_chat as soak_chat
from app.conversations import ConversationStore
from app.soak_disk import DiskFill, fill_refusal
from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server


def _skip_unless_fillable(path: Path) -> None:
    why = fill_refusal(path)
    if why is not None:
        pytest.skip(f"the disk is not filled here: {why}")


def test_a_disk_fill_refuses_writes_and_gives_the_room_back(tmp_path: Path) -> None:
    _skip_unless_fillable(tmp_path)
    with DiskFill(tmp_path) as fill:
        assert fill.taken > 0
        with pytest.raises(OSError) as caught, open(tmp_path / "x", "wb") as f:
            f.write(b"x" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
        assert caught.value.errno == 28  # ENOSPC
    (tmp_path / "y").write_bytes(b"x" * (1 << 20))  # the room is back


def test_the_chat_stand_in_keeps_what_a_full_disk_refused_and_saves_it_later(live, monkeypatch) -> None:
    monkeypatch.setattr(soak_chat, "TURN_GAP_S", 0.05)
    monkeypatch.setattr(soak_chat, "FILL_HOLD_S", 0.3)
    s = live(fake())
    chat = soak_chat.ChatStandIn(s.url, "fake-model", random.Random(0), duration_s=0.3, fill=True)
    _skip_unless_fillable(chat.directory)
    chat.start()
    deadline = time.monotonic() + 60
    while (chat.fills < 1 or chat.turns < 8) and time.monotonic() < deadline:
        time.sleep(0.05)
    chat.stop()
    report = chat.report()
    assert report["error"] is None and report["disk_fills"] >= 1 and report["longest_fill_s"] < 5
    assert report["refused_while_full"] >= 2  # the reply that arrived on the full disk, the message typed then
    assert report["lost"] == 0 and report["saved"] == len(chat.expected) >= 8
    store = ConversationStore.open(chat.directory / "conversations.db")
    (conv,) = store.list()
    roles = [m.role for m in store.get(conv.id).messages]
    store.close()
    assert roles == ["user", "assistant"] * (len(roles) // 2)  # every reply after its message, none twice
