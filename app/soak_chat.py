"""The chat app's part of a soak (issue 43 item 2): a person chatting through the server, each message and reply
saved in a conversation store as the chat app saves them, while `--chaos` fills the disk under that store for a
moment now and then (app/soak_disk.py).

Each turn: save the user's message (refused while the disk is full: the chat app keeps it in the prompt box, here
it is sent again at the next turn), ask the server for the reply at the chat app's priority, and save the reply
through the chat app's own UnsavedReplies (refused: kept in memory, saved before anything else once there is
room).  A fill turn fills the disk once the reply has come, for FILL_HOLD_S: the reply's save and the next message
meet a full disk.  At the end the store is opened afresh and must hold every message it accepted and every
reply, in order: anything missing is lost.  Report (under "store"): turns, saved (messages in the store),
refused_while_full (saves the full disk refused, each one a StoreFullError, the message the chat app shows),
disk_fills, longest_fill_s, fill_skipped (why the disk was not filled, or null) and lost.
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from app.conversations import ConversationStore, StoreFullError
from app.soak_disk import DiskFill, fill_refusal
from app.unsaved_replies import UnsavedReplies
from backends.priority import INTERACTIVE_PRIORITY

log = logging.getLogger(__name__)

TURN_GAP_S = 2.0  # a person's pace, between one reply and the next message
FILL_HOLD_S = 3.0  # how long the disk stays full
FILL_GAP_S = (30.0, 90.0)  # between fills (the first comes within the first third of the run, at most 20 s in)


class ChatStandIn:
    """A thread chatting through `url` and saving into a store in a fresh directory; `start()`, `stop()`, `report()`."""

    def __init__(self, url: str, model: str, rng: random.Random, duration_s: float, fill: bool) -> None:
        self.url, self.model, self.rng = url, model, rng
        self.directory = Path(tempfile.mkdtemp(prefix="hearth-soak-store-"))
        self.fill_skipped = None if fill else "no --chaos"
        if fill:
            self.fill_skipped = fill_refusal(self.directory)
        self._next_fill = time.monotonic() + min(20.0, duration_s / 3)
        self.expected: list[tuple[str, str]] = []  # (role, text) the store accepted or must still save, in order
        self.turns = self.refused = self.fills = 0
        self.full_s = 0.0  # the longest time the disk was held full
        self._pending_user: str | None = None  # a message the full disk refused, sent again at the next turn
        self._unsaved = UnsavedReplies()
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-chat", daemon=True)
        self.error: str | None = None  # what broke the stand-in itself (reported; a soak failure)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._quit.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            store = ConversationStore.open(self.directory / "conversations.db")
        except Exception as exc:  # noqa: BLE001 - reported as the stand-in's error, not raised in a thread
            self.error = f"could not open the store: {exc}"
            return
        try:
            conv = store.create(model=self.model)
            with httpx.Client(base_url=self.url, timeout=120) as client:
                while not self._quit.wait(TURN_GAP_S):
                    if self.fill_skipped is None and time.monotonic() >= self._next_fill:
                        self._fill_turn(store, client, conv.id)
                        self._next_fill = time.monotonic() + self.rng.uniform(*FILL_GAP_S)
                    else:
                        self._turn(store, client, conv.id)
                self._unsaved.flush(store)
        except Exception as exc:  # anything but StoreFullError is a failure the report names (logged)
            log.exception("soak chat stand-in failed")
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            store.close()

    def _fill_turn(self, store: ConversationStore, client: httpx.Client, conversation_id: int) -> None:
        """A turn whose reply is saved on a full disk, and a next message typed before there is room again.  The
        reply is asked for before the disk fills, so the disk is full for FILL_HOLD_S and not a moment longer
        (a reply can take a minute under chaos, and the whole machine shares the disk)."""
        text = self._save_user(store, conversation_id)
        if text is None:
            return
        reply = self._ask(client, text)
        with self._full_disk():
            self._save_reply(store, conversation_id, reply)
            self._save_user(store, conversation_id)  # refused: the chat app keeps it in the prompt box
            time.sleep(FILL_HOLD_S)

    @contextlib.contextmanager
    def _full_disk(self) -> Iterator[None]:
        try:
            fill = DiskFill(self.directory).__enter__()
        except OSError as exc:  # fallocate refused here after all: go on without, and stop trying
            self.fill_skipped = f"fallocate failed: {exc}"
            yield
            return
        self.fills += 1
        began = time.monotonic()
        try:
            yield
        finally:
            fill.__exit__()
            self.full_s = max(self.full_s, time.monotonic() - began)

    def _turn(self, store: ConversationStore, client: httpx.Client, conversation_id: int) -> None:
        text = self._save_user(store, conversation_id)
        if text is not None:
            self._reply(store, client, conversation_id, text)

    def _save_user(self, store: ConversationStore, conversation_id: int) -> str | None:
        """Save the next user message (or the one refused before) as the chat app does: replies still waiting
        first; the text when saved, None when the full disk refused it (it is sent again at the next turn)."""
        self.turns += 1
        text = self._pending_user or f"Message {self.turns}: name a colour."
        self._pending_user = text
        if not self._unsaved.flush(store):
            self.refused += 1
            return None
        try:
            store.add_message(conversation_id, "user", text)
        except StoreFullError:
            self.refused += 1
            return None
        self._pending_user = None
        self.expected.append(("user", text))
        return text

    def _reply(self, store: ConversationStore, client: httpx.Client, conversation_id: int, text: str) -> None:
        self._save_reply(store, conversation_id, self._ask(client, text))

    def _save_reply(self, store: ConversationStore, conversation_id: int, reply: str) -> None:
        self.expected.append(("assistant", reply))
        if not self._unsaved.add(store, conversation_id, reply, None):
            self.refused += 1  # kept in memory, saved before the next message

    def _ask(self, client: httpx.Client, text: str) -> str:
        """The server's reply, or the error the chat app would show in its place (saved the same way)."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 16,
            "priority": INTERACTIVE_PRIORITY,
        }
        try:
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code == 200:
                return str(r.json()["choices"][0]["message"]["content"])
            return f"[error {r.status_code}]"
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return f"[error {type(exc).__name__}]"

    def report(self) -> dict[str, Any]:
        """The module docstring's keys; `lost` compares a fresh open of the store with what it accepted."""
        saved: list[tuple[str, str]] = []
        try:
            store = ConversationStore.open(self.directory / "conversations.db")
            try:
                for conv in store.list():
                    full = store.get(conv.id)
                    saved += [(m.role, m.content) for m in (full.messages if full else ())]
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - an unreadable store is itself the finding
            self.error = self.error or f"could not read the store back: {exc}"
        lost = sum(1 for i, item in enumerate(self.expected) if i >= len(saved) or saved[i] != item)
        return {
            "turns": self.turns,
            "saved": len(saved),
            "refused_while_full": self.refused,
            "disk_fills": self.fills,
            "longest_fill_s": round(self.full_s, 2),
            "fill_skipped": self.fill_skipped,
            "lost": lost,
            "error": self.error,
            "directory": str(self.directory),
        }
