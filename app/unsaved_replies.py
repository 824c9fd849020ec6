"""Replies the chat app could not save because the disk was full (app/conversations.py's StoreFullError): kept in
memory, in order, and saved as soon as there is room (before the next message of any conversation is saved, and
every RETRY_S while any wait), so a full disk costs nothing that was said, and nothing saved before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.conversations import ConversationStore, StoreFullError

RETRY_S = 5.0


@dataclass
class UnsavedReplies:
    waiting: list[tuple[int, str, str, dict[str, Any] | None]] = field(default_factory=list)

    def add(self, store: ConversationStore, conversation_id: int, text: str, stats: dict[str, Any] | None) -> bool:
        """Save a reply (after any still waiting); False when the disk is full (it waits in memory then)."""
        self.waiting.append((conversation_id, "assistant", text, stats))
        return self.flush(store)

    def flush(self, store: ConversationStore) -> bool:
        """Save what waits, oldest first; True when nothing waits any more."""
        while self.waiting:
            conversation_id, role, text, stats = self.waiting[0]
            try:
                store.add_message(conversation_id, role, text, stats)
            except StoreFullError:
                return False
            self.waiting.pop(0)
        return True
