from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.paths import get_paths
from app.store import STARTER_NAME, ModelStore
from backends.errors import ConfigError, ModelFormatError, ModelNotFoundError
from tests.gguf_factory import write_tiny_llama


def test_hearth_home_relocates_everything(hearth_home: Path) -> None:
    p = get_paths()
    for d in (p.data_dir, p.config_dir, p.cache_dir, p.log_dir):
        assert hearth_home in d.parents


def test_starter_is_default_with_empty_or_deleted_data_dir(starter_path: Path, hearth_home: Path) -> None:
    store = ModelStore()
    entry = store.resolve(None)
    assert entry.name == STARTER_NAME and Path(entry.path) == starter_path and entry.source == "builtin"
    import shutil

    shutil.rmtree(hearth_home, ignore_errors=True)
    assert ModelStore().resolve(None).name == STARTER_NAME


def test_add_registers_without_copying(tmp_path: Path, starter_path: Path) -> None:
    f = write_tiny_llama(tmp_path / "Tiny-Model.Q8_0.gguf", weight_type="Q8_0")
    store = ModelStore()
    entry, spec = store.add(f)
    assert entry.name == "tiny-model.q8_0" and Path(entry.path) == f.resolve() and not entry.owned
    assert not list(store.paths.models_dir.glob("*")) if store.paths.models_dir.exists() else True
    named, _ = store.add(f, name="tiny")
    assert [e.name for e in store.entries()] == [STARTER_NAME, "tiny", "tiny-model.q8_0"]
    assert store.resolve("tiny").path == str(f.resolve())
    with pytest.raises(ConfigError, match="already registered"):
        store.add(f, name="tiny")
    with pytest.raises(ConfigError, match="not allowed"):
        store.add(f, name="bad name/../x")
    store.remove("tiny")
    assert store.get("tiny") is None


def test_add_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_text("hello")
    with pytest.raises(ModelFormatError):
        ModelStore().add(bad)
    assert ModelStore().get("x") is None


def test_unknown_and_vanished_models(tmp_path: Path) -> None:
    store = ModelStore()
    with pytest.raises(ModelNotFoundError, match="no model named 'nope'"):
        store.resolve("nope")
    f = write_tiny_llama(tmp_path / "t.gguf")
    store.add(f, name="t")
    f.unlink()
    with pytest.raises(ModelNotFoundError, match="no longer exists"):
        store.resolve("t")


def test_corrupt_registry_is_an_error_not_a_wipe(hearth_home: Path) -> None:
    store = ModelStore()
    store.paths.ensure()
    store.paths.registry_file.write_text("{not json")
    with pytest.raises(ConfigError, match="corrupt"):
        store.entries()
    assert store.paths.registry_file.read_text() == "{not json"


def test_spec_cache_is_used_and_invalidated(tmp_path: Path, gemma_path: Path) -> None:
    store = ModelStore()
    t0 = time.perf_counter()
    store.spec_for_path(gemma_path)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    cached = store.spec_for_path(gemma_path)
    second = time.perf_counter() - t0
    assert cached.vocab_size == 262144 and len(list(store.paths.spec_cache_dir.glob("*.json"))) == 1
    assert second < first  # the cached read skips the header walk
    f = write_tiny_llama(tmp_path / "t.gguf", n_layers=2)
    assert store.spec_for_path(f).n_layers == 2
    write_tiny_llama(f, n_layers=3)
    assert store.spec_for_path(f).n_layers == 3  # size/mtime changed: re-read


def test_last_used_model_is_default(tmp_path: Path) -> None:
    store = ModelStore()
    f = write_tiny_llama(tmp_path / "t.gguf")
    store.add(f, name="t")
    store.update_state(last_model="t")
    assert store.default_model_name() == "t"
    store.remove("t")
    assert store.default_model_name() == STARTER_NAME
    assert json.loads(store.paths.state_file.read_text())["last_model"] == "t"
