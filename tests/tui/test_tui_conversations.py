"""The conversation store: titles, settings, truncate, search, export, and refusing bad files untouched."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app.conversations import SCHEMA_VERSION, ChatSettings, ConversationStore, title_from
from hwprobe.errors import ConfigError

pytestmark = pytest.mark.tui


def test_titles_settings_truncate_search_export(tmp_path) -> None:
    store = ConversationStore.open(tmp_path / "c.db")
    conv = store.create(ChatSettings("be brief", 0.0, 0.5, 64, 7), model="m")
    store.add_message(conv.id, "user", "  What is\nthe capital of France?  ")
    store.add_message(conv.id, "assistant", "Paris.", {"completion_tokens": 2})
    store.add_message(conv.id, "user", "And of Italy?")
    got = store.get(conv.id)
    assert got.title == "What is the capital of France?" and not got.renamed
    assert got.chat_messages()[0] == {"role": "system", "content": "be brief"}
    assert got.messages[1].stats == {"completion_tokens": 2}
    store.rename(conv.id, "Capitals")
    store.truncate(conv.id, 2)
    assert [m.content for m in store.get(conv.id).messages] == ["  What is\nthe capital of France?  ", "Paris."]
    store.update_settings(conv.id, ChatSettings("", 1.0, 1.0, 10, None))
    assert store.get(conv.id).chat_messages()[0]["role"] == "user"  # empty system prompt: none sent
    other = store.create()
    assert [c.id for c in store.list("paris")] == [conv.id]
    assert [c.id for c in store.list("100%")] == []  # LIKE wildcards are escaped
    assert {c.id for c in store.list()} == {conv.id, other.id}
    md = store.export_markdown(conv.id)
    assert md.startswith("# Capitals") and "## Assistant\n\nParis." in md
    data = json.loads(store.export_json(conv.id))
    assert data["settings"]["max_tokens"] == 10 and [m["role"] for m in data["messages"]] == ["user", "assistant"]
    store.delete(conv.id)
    assert store.get(conv.id) is None and store.list("paris") == []
    with pytest.raises(ConfigError):
        store.rename(other.id, "   ")
    assert title_from("x" * 100).endswith("…") and len(title_from("x" * 100)) == 60
    store.close()
    with sqlite3.connect(tmp_path / "c.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("kind", ["garbage", "truncated", "newer", "foreign"])
def test_bad_database_is_refused_and_left_untouched(tmp_path, kind) -> None:
    path = tmp_path / "c.db"
    if kind == "garbage":
        path.write_bytes(b"this is not a database at all" * 100)
    else:
        store = ConversationStore.open(path)
        store.add_message(store.create().id, "user", "keep me")
        store.close()
        if kind == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[:100] + b"\x00" * 50 + data[150 : len(data) // 2])
        elif kind == "newer":
            with sqlite3.connect(path) as raw:
                raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        else:
            path.unlink()
            with sqlite3.connect(path) as raw:
                raw.execute("CREATE TABLE notes (x)")
    before = path.read_bytes()
    with pytest.raises(ConfigError) as err:
        ConversationStore.open(path)
    assert str(path) in err.value.message and "untouched" in err.value.message and err.value.hint
    if kind == "newer":
        assert f"version {SCHEMA_VERSION + 1}" in err.value.message
    assert path.read_bytes() == before
    assert not (tmp_path / "c.db-wal").exists() or kind != "garbage"


def test_cli_reports_bad_database_without_traceback(tmp_path, hearth_home) -> None:
    import subprocess
    import sys

    from app.paths import get_paths

    db = get_paths().conversations_db
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"junk" * 1000)
    r = subprocess.run([sys.executable, "-m", "app", "chat"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "damaged or not a database" in r.stderr and "Traceback" not in r.stderr
    assert db.read_bytes() == b"junk" * 1000
