"""Issue 16 item 3: model paths that cannot be read (no permission, a FIFO, a symlink loop, a directory) are one
line and exit 2 on `run`, `show` and `models add`, cheaply, and never hang (a FIFO would block a plain open)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.errors import ModelFormatError
from tests.hostile.clirun import assert_one_line_error, hearth

COMMANDS = (("run", "-m", "{path}", "hi"), ("show", "{path}"), ("models", "add", "{path}"))


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe.gguf"
    os.mkfifo(p)
    return p


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    return tmp_path / "a.gguf"


def _dangling(tmp_path: Path) -> Path:
    (tmp_path / "gone.gguf").symlink_to(tmp_path / "never-there.gguf")
    return tmp_path / "gone.gguf"


def _directory(tmp_path: Path) -> Path:
    d = tmp_path / "folder.gguf"
    d.mkdir()
    return d


def _unreadable(tmp_path: Path) -> Path:
    p = tmp_path / "secret.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 100)
    p.chmod(0)
    return p


@pytest.mark.parametrize(
    "make, match",
    [
        (_fifo, "is a FIFO (named pipe), not a GGUF file"),
        (_loop, "is a symlink loop"),
        (_dangling, "does not exist"),
        (_directory, "has no config.json"),  # a folder is read as a Hugging Face model folder
        pytest.param(
            _unreadable,
            "cannot be read: permission denied",
            marks=pytest.mark.skipif(
                os.geteuid() == 0, reason="root reads any file; test_unreadable_file_in_process covers the message"
            ),
        ),
    ],
    ids=["fifo", "symlink-loop", "dangling-link", "directory", "no-permission"],
)
@pytest.mark.parametrize("command", COMMANDS, ids=["run", "show", "models-add"])
def test_unreadable_paths(make, match: str, command: tuple[str, ...], tmp_path: Path) -> None:
    path = make(tmp_path)
    assert_one_line_error(hearth(*(a.format(path=path) for a in command), timeout=20), match)


def test_unreadable_file_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The permission message, even where the tests run as root (who may read anything)."""
    from backends.modelspec import load_spec

    p = tmp_path / "secret.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 100)
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if Path(path) == p:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(ModelFormatError, match="cannot be read: permission denied"):
        load_spec(p)


def test_fifo_settings_file_and_json_do_not_hang(tmp_path: Path) -> None:
    """The other files hearth reads at start-up refuse FIFOs as well (settings.toml, an HF config.json)."""
    from app.settings import load_settings
    from backends.modelspec import load_spec
    from hwprobe.errors import ConfigError

    os.mkfifo(tmp_path / "settings.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(tmp_path / "settings.toml", env={})
    folder = tmp_path / "hf"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(ModelFormatError, match="FIFO"):
        load_spec(folder)
