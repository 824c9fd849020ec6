"""Conversations on disk: one SQLite database (WAL) at Paths.conversations_db.

Every message is committed as soon as it exists (the user's when it is sent, the assistant's when its reply
ends or is stopped), so killing the app, even with SIGKILL, loses at most the reply in flight.

The schema version lives in `PRAGMA user_version`.  A file that is not a SQLite database, is damaged, or was
written by a newer hearth is refused with a ConfigError and never written to: we only open it, read, and close.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.defaults import REPLY_MAX_TOKENS, SAMPLING, SYSTEM_PROMPT
from app.paths import get_paths
from hwprobe.errors import ConfigError, HearthError

SCHEMA_VERSION = 1
LOCK_WAIT_S = 5.0  # how long to wait for another process's write before saying the database is locked
TITLE_CHARS = 60  # a title taken from the first message is cut to this many characters

_SCHEMA = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    renamed INTEGER NOT NULL DEFAULT 0,      -- 1 once the user named it: the first message no longer titles it
    system_prompt TEXT NOT NULL DEFAULT '',
    temperature REAL NOT NULL,
    top_p REAL NOT NULL,
    max_tokens INTEGER NOT NULL,
    seed INTEGER,                            -- NULL = random
    model TEXT,                              -- model name last used in it (informational)
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,               -- 0, 1, 2 ... within the conversation (system prompt not stored here)
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    stats TEXT,                              -- JSON RequestStats.as_dict() of an assistant reply, else NULL
    created_at REAL NOT NULL,
    UNIQUE (conversation_id, position)
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, position);
"""


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation sampling settings and system prompt."""

    system_prompt: str = SYSTEM_PROMPT  # "" = no system message
    temperature: float = SAMPLING.temperature  # 0 = greedy
    top_p: float = SAMPLING.top_p
    max_tokens: int = REPLY_MAX_TOKENS  # most tokens in one reply
    seed: int | None = None  # None = random


@dataclass(frozen=True)
class Message:
    role: str  # "user" | "assistant"
    content: str
    position: int  # index within the conversation
    stats: dict[str, Any] | None = None  # assistant replies: RequestStats.as_dict()


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str  # "" until the first message
    renamed: bool  # the user chose the title
    settings: ChatSettings
    model: str | None
    created_at: float
    updated_at: float
    messages: tuple[Message, ...] = field(default=())

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as a chat template wants them, with the system prompt first when there is one."""
        out = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        return out + [{"role": m.role, "content": m.content} for m in self.messages]


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ConversationStore:
    """All conversations.  Open with `ConversationStore.open(path)`; every write is its own transaction."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path | None = None) -> ConversationStore:
        if path is None:
            path = get_paths().conversations_db
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists() and path.stat().st_size > 0
        if existed:
            _check_existing(path)
        conn = sqlite3.connect(path, timeout=LOCK_WAIT_S, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a killed process
            conn.execute("PRAGMA foreign_keys=ON")
            if not existed:  # one transaction: a crash here leaves no half schema
                conn.executescript("BEGIN;" + _SCHEMA + f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise (_locked(path) if _is_locked(exc) else _corrupt(path, exc)) from None
        conn.row_factory = sqlite3.Row
        return cls(conn, path)

    def close(self) -> None:
        self._conn.close()

    # -- conversations ------------------------------------------------------------------------------------
    def create(self, settings: ChatSettings | None = None, model: str | None = None) -> Conversation:
        s = settings or ChatSettings()
        now = time.time()
        with _transaction(self._conn):
            cur = self._conn.execute(
                "INSERT INTO conversations (system_prompt, temperature, top_p, max_tokens, seed, model, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (s.system_prompt, s.temperature, s.top_p, s.max_tokens, s.seed, model, now, now),
            )
        conv = self.get(int(cur.lastrowid or 0))
        assert conv is not None
        return conv

    def get(self, conversation_id: int) -> Conversation | None:
        row = self._conn.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            return None
        msgs = tuple(
            Message(r["role"], r["content"], r["position"], json.loads(r["stats"]) if r["stats"] else None)
            for r in self._conn.execute(
                "SELECT role, content, position, stats FROM messages WHERE conversation_id = ? ORDER BY position",
                (conversation_id,),
            )
        )
        return _conversation(row, msgs)

    def list(self, query: str = "") -> list[Conversation]:
        """Conversations, most recently updated first (without messages); `query` filters by title or text."""
        if query:
            like = f"%{_escape_like(query)}%"
            rows = self._conn.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m "
                "WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\') ORDER BY updated_at DESC, id DESC",
                (like, like),
            ).fetchall()
        else:
            rows = self._conn.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        return [_conversation(r, ()) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise ConfigError("a conversation title cannot be empty")
        self._update(conversation_id, "title = ?, renamed = 1", (title,))

    def update_settings(self, conversation_id: int, s: ChatSettings) -> None:
        self._update(
            conversation_id,
            "system_prompt = ?, temperature = ?, top_p = ?, max_tokens = ?, seed = ?",
            (s.system_prompt, s.temperature, s.top_p, s.max_tokens, s.seed),
        )

    def set_model(self, conversation_id: int, model: str) -> None:
        self._update(conversation_id, "model = ?", (model,))

    def delete(self, conversation_id: int) -> None:
        with _transaction(self._conn):
            self._conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------------------------------
    def add_message(
        self, conversation_id: int, role: str, content: str, stats: dict[str, Any] | None = None
    ) -> Message:
        """Append a message (committed before this returns).  The first user message titles the conversation
        unless it was renamed."""
        now = time.time()
        with _transaction(self._conn):
            row = self._conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            position = int(row[0])
            self._conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, stats, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, position, role, content, json.dumps(stats) if stats else None, now),
            )
            self._conn.execute(
                "UPDATE conversations SET updated_at = ?, title = CASE WHEN renamed = 0 AND title = '' AND ? = 'user' "
                "THEN ? ELSE title END WHERE id = ?",
                (now, role, title_from(content), conversation_id),
            )
        return Message(role, content, position, stats)

    def truncate(self, conversation_id: int, position: int) -> None:
        """Drop the messages at `position` and after (regenerate, edit-and-resend)."""
        with _transaction(self._conn):
            self._conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, position)
            )

    # -- export -------------------------------------------------------------------------------------------
    def export_json(self, conversation_id: int) -> str:
        conv = self._require(conversation_id)
        data = {
            "hearth_conversation": SCHEMA_VERSION,
            "id": conv.id,
            "title": conv.title,
            "model": conv.model,
            "settings": asdict(conv.settings),
            "created_at": conv.created_at,
            "updated_at": conv.updated_at,
            "messages": [asdict(m) for m in conv.messages],
        }
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def export_markdown(self, conversation_id: int) -> str:
        conv = self._require(conversation_id)
        s = conv.settings
        lines = [
            f"# {conv.title or 'Untitled conversation'}",
            "",
            f"- model: {conv.model or 'unknown'}",
            f"- temperature {s.temperature}, top-p {s.top_p}, max tokens {s.max_tokens}, seed {s.seed}",
            "",
        ]
        if s.system_prompt:
            lines += ["## System", "", s.system_prompt, ""]
        for m in conv.messages:
            lines += [f"## {'You' if m.role == 'user' else 'Assistant'}", "", m.content, ""]
        return "\n".join(lines)

    # -- internals ----------------------------------------------------------------------------------------
    def _require(self, conversation_id: int) -> Conversation:
        conv = self.get(conversation_id)
        if conv is None:
            raise ConfigError(f"no conversation with id {conversation_id}")
        return conv

    def _update(self, conversation_id: int, assignments: str, values: tuple[Any, ...]) -> None:
        with _transaction(self._conn):
            self._conn.execute(
                f"UPDATE conversations SET {assignments}, updated_at = ? WHERE id = ?",
                (*values, time.time(), conversation_id),
            )


def _conversation(row: sqlite3.Row, msgs: tuple[Message, ...]) -> Conversation:
    s = ChatSettings(row["system_prompt"], row["temperature"], row["top_p"], row["max_tokens"], row["seed"])
    return Conversation(
        row["id"], row["title"], bool(row["renamed"]), s, row["model"], row["created_at"], row["updated_at"], msgs
    )


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write, all or nothing.  A full disk (SQLITE_FULL, or a write error while the disk is full) rolls it back
    and raises StoreFullError: what was committed before stays, and the same write works again once there is room."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # a rollback has nothing to write; if even it fails the journal undoes it at the next open
        if isinstance(exc, sqlite3.OperationalError) and _is_full(exc):
            raise StoreFullError(
                "the disk holding the conversations database is full: this was not saved (what was saved before "
                "is safe)",
                "free some space; hearth saves it again then",
            ) from None
        raise


class StoreFullError(HearthError):
    """A write the full disk refused; nothing saved before is lost (ConversationStore._transaction)."""


def _is_full(exc: Exception) -> bool:
    """SQLITE_FULL (13), or an I/O error writing (SQLITE_IOERR, 10) on a disk with no room left."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # Python 3.10: the message is all there is
        return "full" in str(exc)
    return code & 0xFF in (13, 10)


def _corrupt(path: Path, exc: Exception) -> ConfigError:
    return ConfigError(
        f"the conversations database {path} is damaged or not a database ({exc}); hearth left it untouched",
        f"move it away (e.g. `mv {path} {path}.bad`) to start with an empty one",
    )


def _is_locked(exc: Exception) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED (another process holds the lock), told by the error code, not the text."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # Python 3.10 has no error codes on exceptions: its message is all there is
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
    return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (extended codes keep them in the low byte)


def _locked(path: Path) -> ConfigError:
    return ConfigError(
        f"the conversations database {path} is locked by another process (waited "
        f"{LOCK_WAIT_S:g} s); it is not damaged and hearth left it untouched",
        "close the other hearth (or whatever holds the file) and try again",
    )


def _expected_columns() -> dict[str, list[str]]:
    """Each table's columns as _SCHEMA creates them (read back from an in-memory database, so the two never
    disagree)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(_SCHEMA)
        return {t: [r[1] for r in mem.execute(f"PRAGMA table_info({t})")] for t in ("conversations", "messages")}
    finally:
        mem.close()


def _check_existing(path: Path) -> None:
    """Refuse (read-only, without writing a byte) a file that is not ours or is newer than this hearth."""
    with open(path, "rb") as fh:
        header = fh.read(16)
    if header != b"SQLite format 3\x00":
        raise _corrupt(path, ValueError("no SQLite header"))
    try:
        ro = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
        try:
            version = ro.execute("PRAGMA user_version").fetchone()[0]
            ok = ro.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in ro.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {
                t: [r[1] for r in ro.execute(f"PRAGMA table_info({t})")]
                for t in ("conversations", "messages")
                if t in tables
            }
        finally:
            ro.close()
    except sqlite3.DatabaseError as exc:
        raise (_locked(path) if _is_locked(exc) else _corrupt(path, exc)) from None
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"the conversations database {path} has schema version {version}, newer than this "
            f"hearth's {SCHEMA_VERSION}; hearth left it untouched",
            "upgrade hearth (pip install -U hearth-llm), or move the file away",
        )
    if ok != "ok":
        raise _corrupt(path, ValueError(f"integrity check: {ok}"))
    if version < 1 or not {"conversations", "messages"} <= tables:
        raise _corrupt(path, ValueError(f"schema version {version}, tables {sorted(tables)}"))
    for table, want in _expected_columns().items():
        if columns[table] != want:
            missing = [c for c in want if c not in columns[table]]
            extra = [c for c in columns[table] if c not in want]
            raise ConfigError(
                f"the conversations database {path} says schema version {version} but its {table} "
                f"table has other columns (missing: {', '.join(missing) or 'none'}; unknown: "
                f"{', '.join(extra) or 'none'}); hearth left it untouched",
                f"it was not written by this hearth: move it away (e.g. `mv {path} {path}.bad`)",
            )


__all__ = ["ConversationStore", "Conversation", "Message", "ChatSettings", "SCHEMA_VERSION", "title_from"]
