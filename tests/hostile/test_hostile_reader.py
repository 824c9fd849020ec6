"""The reader's caps and the checks' edges, in process (fast): what real models use is accepted (per-layer
arrays, split shards), what only a hostile header does is refused with the cap named."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.errors import ModelFormatError
from backends.modelspec import load_spec
from tests.hostile.ggufraw import ARRAY, STRING, U16, U32


def test_per_layer_arrays_are_accepted(raw, tmp_path: Path) -> None:
    """llama.cpp reads head_count / head_count_kv / feed_forward_length as one uint32 per layer too."""
    r = (
        raw()
        .set("llama.attention.head_count_kv", ARRAY, (U32, [2, 2]))
        .set("llama.feed_forward_length", ARRAY, (U32, [128, 128]))
    )
    spec = load_spec(r.write(tmp_path / "per-layer.gguf"))
    assert (spec.n_kv_heads, spec.ffn_size, spec.n_layers) == (2, 128, 2)


def test_per_layer_array_of_the_wrong_length(raw, tmp_path: Path) -> None:
    r = raw().set("llama.attention.head_count_kv", ARRAY, (U32, [2, 2, 2]))
    with pytest.raises(ModelFormatError, match="head_count_kv has 3 entries for 2 layers"):
        load_spec(r.write(tmp_path / "bad.gguf"))


def test_per_layer_array_of_strings(raw, tmp_path: Path) -> None:
    r = raw().set("llama.attention.head_count", ARRAY, (STRING, ["4", "4"]))
    with pytest.raises(ModelFormatError, match=r"head_count is an array\[string\], expected uint32 or an array"):
        load_spec(r.write(tmp_path / "bad.gguf"))


def test_string_over_one_mib(raw, tmp_path: Path) -> None:
    r = raw().set("general.description", STRING, "x" * ((1 << 20) + 1))
    with pytest.raises(ModelFormatError, match="claims a string of 1,048,577 bytes; hearth reads at most 1,048,576"):
        load_spec(r.write(tmp_path / "bad.gguf"))


def test_metadata_read_budget(raw, tmp_path: Path) -> None:
    """Many values that are each allowed still cannot add up past the budget (memory stays bounded)."""
    r = raw()
    for i in range(40):
        r.set(f"general.note{i}", STRING, "x" * (1 << 20))
    with pytest.raises(ModelFormatError, match="more than hearth's limit of 32 MiB"):
        load_spec(r.write(tmp_path / "bad.gguf"))


def test_duplicate_metadata_key(raw, tmp_path: Path) -> None:
    r = raw()
    r.kvs.append(r.kvs[0])
    with pytest.raises(ModelFormatError, match="metadata key general.architecture appears twice"):
        load_spec(r.write(tmp_path / "bad.gguf"))


def test_too_many_dimensions_and_a_long_name(raw, tmp_path: Path) -> None:
    r = raw()
    r.tensor("output_norm.weight").shape = [64, 1, 1, 1, 1]
    with pytest.raises(ModelFormatError, match="claims 5 dimensions"):
        load_spec(r.write(tmp_path / "dims.gguf"))
    r = raw()
    r.tensor("output_norm.weight").name = "x" * 64
    with pytest.raises(ModelFormatError, match="longer than ggml's 63 bytes"):
        load_spec(r.write(tmp_path / "name.gguf"))


def test_shard_that_says_another_place(raw, tmp_path: Path) -> None:
    """Two shards named 1-of-2 and 2-of-2, where the second says it is shard 0 again."""
    first = raw().set("split.count", U16, 2).set("split.no", U16, 0)
    first.write(tmp_path / "m-00001-of-00002.gguf")
    first.write(tmp_path / "m-00002-of-00002.gguf")
    with pytest.raises(ModelFormatError, match="it says it is shard 0 of 2, expected 1 of 2"):
        load_spec(tmp_path / "m-00001-of-00002.gguf")


def test_real_models_pass_every_check(starter_path: Path) -> None:
    spec = load_spec(starter_path)
    assert spec.n_layers == 30 and spec.vocab_size == 49152


def test_gemma_passes_every_check(gemma_path: Path) -> None:
    spec = load_spec(gemma_path)  # head_dim 256 from key_length, 262,144 tokens, Q5_0 / Q4_K / Q6_K tensors
    assert (spec.head_dim, spec.vocab_size, spec.n_layers) == (256, 262144, 18)


def test_kept_string_arrays_read_whole_and_keep_the_caps(raw, tmp_path: Path) -> None:
    """A vocabulary-like array of strings (the reader's fast loop, _Cursor.strings): read whole, and its
    elements meet the same one-string cap and the same metadata budget as single strings."""
    from backends.gguf_reader import read_header

    words = ["a", "", "é", "x" * 300, "\u0120the"]
    ok = raw().set("test.words", ARRAY, (STRING, words)).write(tmp_path / "ok.gguf")
    assert read_header(ok, keep_arrays=["test.words"]).metadata["test.words"] == words
    big = raw().set("test.words", ARRAY, (STRING, ["a", "x" * ((1 << 20) + 1)])).write(tmp_path / "big.gguf")
    with pytest.raises(ModelFormatError, match="claims a string of 1,048,577 bytes"):
        read_header(big, keep_arrays=["test.words"])
    many = raw().set("test.words", ARRAY, (STRING, ["x" * (1 << 20)] * 40)).write(tmp_path / "many.gguf")
    with pytest.raises(ModelFormatError, match="more than hearth's limit of 32 MiB"):
        read_header(many, keep_arrays=["test.words"])
