"""Issue 16 item 6: settings.toml as a directory and bad flags are one line and exit 2 before any model is
read; a locked conversations database says it is locked, not damaged; one with hearth's version but other
columns is refused and left untouched; `hearth run` never exits non-zero without a message."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from tests.hostile.clirun import assert_one_line_error, hearth


@pytest.mark.parametrize(
    "flags, match",
    [
        (("--threads", "0"), "threads must be between 1 and 1024, got 0"),
        (("--temperature", "inf"), "temperature must be >= 0 and finite, got inf"),
        (("--temperature", "nan"), "temperature must be >= 0 and finite, got nan"),
        (("--n-gpu-layers", "-5"), "n_gpu_layers must be -1 (all layers) or a count >= 0, got -5"),
        (("--top-p", "0"), "top_p must be in (0, 1], got 0.0"),
        (("--seed", str(2**70)), "seed must be a 64-bit integer"),
        (("--ctx", str(10**12)), "ctx must be at most 16,777,216 tokens"),
        (("--max-tokens", "0"), "max_tokens must be between 1 and"),
    ],
    ids=[
        "threads-0",
        "temperature-inf",
        "temperature-nan",
        "ngl-minus-5",
        "top_p-0",
        "seed-2^70",
        "ctx-1e12",
        "max-tokens-0",
    ],
)
def test_bad_flags(flags: tuple[str, ...], match: str) -> None:
    assert_one_line_error(hearth("run", "-m", "/nonexistent/never-read.gguf", *flags, "hi"), match)


def test_bad_environment_value() -> None:
    assert_one_line_error(hearth("run", "hi", env={"HEARTH_TEMPERATURE": "inf"}), "temperature must be >= 0 and finite")


def test_settings_file_that_is_a_directory(hearth_home: Path) -> None:
    from app.paths import get_paths

    get_paths().settings_file.mkdir(parents=True)
    assert_one_line_error(hearth("run", "hi"), "is a directory, not a TOML file")


def test_settings_file_with_non_finite_value(hearth_home: Path) -> None:
    from app.paths import get_paths

    f = get_paths().settings_file
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("[sampling]\ntemperature = inf\n")
    assert_one_line_error(hearth("run", "hi"), "temperature must be >= 0 and finite, got inf")


# -- the conversations database -------------------------------------------------------------------------


def test_locked_database_says_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.conversations as conversations
    from hwprobe.errors import ConfigError

    path = tmp_path / "conversations.sqlite3"
    store = conversations.ConversationStore.open(path)
    store.create()
    store.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write, holding the file
    monkeypatch.setattr(conversations, "LOCK_WAIT_S", 0.2)
    try:
        with pytest.raises(ConfigError, match="is locked by another process") as info:
            conversations.ConversationStore.open(path)
        assert "damaged" not in info.value.message.replace("it is not damaged", "")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    conversations.ConversationStore.open(path).close()  # fine once the other process lets go


def test_right_version_wrong_columns_is_refused_untouched(tmp_path: Path) -> None:
    from app.conversations import ConversationStore
    from hwprobe.errors import ConfigError

    path = tmp_path / "conversations.sqlite3"
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT);"
        "INSERT INTO conversations (name) VALUES ('mine');"
        "PRAGMA user_version = 1;"
    )
    con.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(
        ConfigError,
        match="says schema version 1 but its conversations table has other columns "
        r"\(missing: title.*unknown: name\); hearth left it untouched",
    ):
        ConversationStore.open(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conversations.sqlite3"]  # no -wal, no -shm


# -- `hearth run` exits non-zero only with a message -----------------------------------------------------


def test_run_error_without_a_reason_still_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.loading
    from app.cli import main
    from app.loading import Decision, Loaded
    from app.store import ModelEntry
    from backends.api import EventKind, FinishReason, GenerationEvent, LoadOptions, RequestStats
    from tests.fakes import FakeBackend, fake_spec

    class Silent(FakeBackend):
        def stream(self, request):
            yield GenerationEvent(
                EventKind.FINISHED,
                request.request_id,
                finish_reason=FinishReason.ERROR,
                stats=RequestStats(),
                error=None,
            )

    backend = Silent()
    loaded = Loaded(
        backend, ModelEntry("fake", "/nonexistent/fake.gguf"), fake_spec(), Decision("fake", LoadOptions(n_ctx=2048))
    )
    monkeypatch.setattr(app.loading, "open_backend", lambda *a, **k: loaded)
    assert main(["run", "hi"]) == 3  # the engine failed: 3, as for a failed load (4 when its runner died)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hearth: error: the backend ended the reply with an error and gave no reason"]
    assert backend.closed
