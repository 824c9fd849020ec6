"""ModelSpec from GGUF headers: the starter model's real figures, tiny test files, and every bad-file case."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.errors import ModelFormatError
from backends.modelspec import load_spec
from tests.gguf_factory import write_tiny_llama


def test_starter_spec_matches_known_figures(starter_path: Path) -> None:
    s = load_spec(starter_path)
    assert (s.architecture, s.n_layers, s.hidden_size, s.n_heads, s.n_kv_heads, s.head_dim) == (
        "llama",
        30,
        576,
        9,
        3,
        64,
    )
    assert (s.vocab_size, s.context_length, s.rope_base, s.ffn_size) == (49152, 8192, 100000.0, 1536)
    assert s.file_type == "Q4_1" and s.tied_embeddings
    assert s.tensor_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1} and len(s.tensors) == 272
    assert s.param_count == 134_515_008
    assert 5.7 < s.bits_per_weight < 5.8  # NOTES.md: 5.74 bpw overall
    assert s.chat_template and "<|im_start|>" in s.chat_template
    assert (s.bos_token_text, s.eos_token_text, s.eos_token_ids) == ("<|im_start|>", "<|im_end|>", (2,))
    assert (
        sum(s.layer_bytes()) + s.tensor("token_embd.weight").n_bytes + s.tensor("output_norm.weight").n_bytes
        == s.weight_bytes
    )


def test_gemma_spec(gemma_path: Path) -> None:
    s = load_spec(gemma_path)
    assert (s.architecture, s.head_dim, s.n_kv_heads, s.vocab_size, s.sliding_window) == ("gemma3", 256, 1, 262144, 512)
    assert s.chat_template is None and s.file_type == "Q4_K_M"
    assert s.tensor_types["Q5_0"] == 81
    shape = s.to_shape()
    assert shape.sliding_window_layers == 15 and shape.quant == "Q4_K_M"


def test_shape_for_planner(tmp_path: Path) -> None:
    p = write_tiny_llama(tmp_path / "t.gguf", n_layers=3, weight_type="Q8_0")
    s = load_spec(p)
    shape = s.to_shape()
    assert shape.n_layers == 3 and len(shape.layer_bytes) == 3 and all(b > 0 for b in shape.layer_bytes)
    assert shape.weight_bytes == s.weight_bytes and shape.quant == "Q8_0" and shape.tied_embeddings


def test_truncated_file_is_reported(tmp_path: Path) -> None:
    p = write_tiny_llama(tmp_path / "t.gguf")
    data = p.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="truncated.*need"):
        load_spec(cut)
    header_only = tmp_path / "head.gguf"
    header_only.write_bytes(data[:200])
    with pytest.raises(ModelFormatError, match="truncated"):
        load_spec(header_only)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "not a GGUF file"),
        (b"PK\x03\x04" + b"\0" * 100, "not a GGUF file"),
        (b"GGUF" + (9).to_bytes(4, "little") + b"\0" * 40, "version 9"),
        (b"GGUF" + (3).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little") + b"\0" * 40, "corrupt"),
    ],
)
def test_bad_files(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(ModelFormatError, match=match):
        load_spec(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="does not exist"):
        load_spec(tmp_path / "nope.gguf")


def test_split_gguf_reads_all_shards(tmp_path: Path) -> None:
    import gguf

    # Two shards written by hand: split.count on the first, tensors in both.
    import numpy as np

    from backends.gguf_reader import read_model_header

    paths = [tmp_path / f"m-{i:05d}-of-00002.gguf" for i in (1, 2)]
    for i, p in enumerate(paths):
        w = gguf.GGUFWriter(str(p), "llama")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", 2)
        w.add_tensor(f"t{i}.weight", np.zeros((4, 8), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    first, shards = read_model_header(paths[0])
    assert len(shards) == 2 and [t.name for h in shards for t in h.tensors] == ["t0.weight", "t1.weight"]
    paths[1].unlink()
    with pytest.raises(ModelFormatError, match="missing"):
        read_model_header(paths[0])
