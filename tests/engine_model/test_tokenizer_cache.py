"""The GGUF tokenizer kept beside the prepared weights (backends/torch_engine/tokenizer_cache.py) on a tiny GGUF
with the starter's vocabulary: a miss stores, a hit gives the ids, text and bytes of a tokenizer built from the
file; a corrupt entry is a miss, deleted and stored again; a changed model file misses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine import tokenizer_cache
from backends.torch_engine.tokenizer import HearthTokenizer, load_tokenizer
from tests.gguf_factory import write_tiny_llama

TEXTS = ["Hello, world! 12345", "<|im_start|>user\nhi<|im_end|>", "  spaces\tand\nnewlines ünïcödé 🙂", ""]


def _spec(tmp_path: Path) -> ModelSpec:
    return load_spec(write_tiny_llama(tmp_path / "tiny.gguf"))


def _same(a: HearthTokenizer, b: HearthTokenizer) -> None:
    for text in TEXTS:
        for special in (True, False):
            ids = a.encode(text, add_special=special, parse_special=special)
            assert b.encode(text, add_special=special, parse_special=special) == ids
            assert b.decode(ids) == a.decode(ids) and b.token_bytes(ids) == a.token_bytes(ids)
    assert b.token_bytes(range(a.vocab_size)) == a.token_bytes(range(a.vocab_size))
    assert (b.bos_id, b.eos_id, b.add_bos, b.add_eos) == (a.bos_id, a.eos_id, a.add_bos, a.add_eos)


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.tok"))


def test_a_hit_gives_what_the_file_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    fresh = load_tokenizer(spec)
    stored = load_tokenizer(spec, str(cache))
    assert isinstance(stored, HearthTokenizer) and len(_entries(cache)) == 1
    built = []
    monkeypatch.setattr("backends.torch_engine.tokenizer._from_gguf", lambda s: built.append(s))
    hit = load_tokenizer(spec, str(cache))
    assert built == []  # read from the entry, not built from the GGUF
    _same(fresh, stored)
    _same(fresh, hit)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "other key", "bad tokenizer"])
def test_a_corrupt_entry_is_a_miss_and_is_stored_again(tmp_path: Path, damage: str) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    fresh = load_tokenizer(spec, str(cache))
    (entry,) = _entries(cache)
    data = entry.read_bytes()
    blob = json.loads(data)
    bad = {
        "truncate": data[: len(data) // 2],
        "garbage": os.urandom(4096),
        "empty": b"",
        "other key": json.dumps(blob | {"key": "0" * 32}).encode(),
        "bad tokenizer": json.dumps(blob | {"tokenizer": '{"model": 3}'}).encode(),
    }[damage]
    entry.write_bytes(bad)
    key = entry.stem
    assert tokenizer_cache.load_entry(cache, key) is None or damage == "bad tokenizer"
    again = load_tokenizer(spec, str(cache))
    _same(fresh, again)
    if damage != "bad tokenizer":  # load_entry above already dropped it; the load stored it again
        assert entry.read_bytes() == data
    else:  # the tokenizers library refused it at the load: dropped, built afresh and stored again
        assert json.loads(entry.read_bytes())["tokenizer"] == blob["tokenizer"]


def test_a_changed_model_file_misses(tmp_path: Path) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    load_tokenizer(spec, str(cache))
    st = os.stat(spec.path)
    os.utime(spec.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    load_tokenizer(load_spec(spec.path), str(cache))
    assert len(_entries(cache)) == 2  # a new key; the old entry ages out with the weights (WeightCache.evict)


def test_an_unwritable_folder_never_fails_a_load(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    _same(load_tokenizer(spec), load_tokenizer(spec, str(blocker / "cache")))
