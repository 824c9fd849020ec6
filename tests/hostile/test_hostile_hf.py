"""Issue 16 item 3: a Hugging Face folder with num_attention_heads 0, a broken tokenizer_config.json or a
damaged safetensors header is one line and exit 2 on `show` and `models add`, like a GGUF."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile.clirun import assert_one_line_error, hearth

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "eos_token_id": 2,
}


def _safetensors(tensors: dict[str, tuple[str, list[int]]], header_extra: dict | None = None) -> bytes:
    """A safetensors file of zeros: name -> (dtype, shape)."""
    size = {"F32": 4, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header.update(header_extra or {})
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


def _folder(
    tmp_path: Path, config: object = None, tokenizer_config: str | None = None, weights: bytes | None = None
) -> Path:
    d = tmp_path / "hf-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    (d / "model.safetensors").write_bytes(
        weights if weights is not None else _safetensors({"model.embed_tokens.weight": ("F32", [256, 64])})
    )
    (d / "tokenizer.json").write_text("{}")
    if tokenizer_config is not None:
        (d / "tokenizer_config.json").write_text(tokenizer_config)
    return d


CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("heads-0", lambda t: _folder(t, {**CONFIG, "num_attention_heads": 0}), "num_attention_heads is 0"),
    (
        "heads-string",
        lambda t: _folder(t, {**CONFIG, "num_attention_heads": "4"}),
        "num_attention_heads is '4', expected an integer",
    ),
    ("layers-1e8", lambda t: _folder(t, {**CONFIG, "num_hidden_layers": 10**8}), "num_hidden_layers is 100,000,000"),
    ("kv-not-dividing", lambda t: _folder(t, {**CONFIG, "num_key_value_heads": 3}), "whole multiple of the KV heads"),
    ("rope-theta-string", lambda t: _folder(t, {**CONFIG, "rope_theta": "1e4"}), "rope_theta is '1e4'"),
    ("config-a-list", lambda t: _folder(t, [1, 2]), "holds a JSON list"),
    ("config-not-json", lambda t: _broken_config(t), "is not valid JSON"),
    ("tokenizer-config-broken", lambda t: _folder(t, tokenizer_config='{"add_bos_token": tru'), "is not valid JSON"),
    ("tokenizer-config-a-string", lambda t: _folder(t, tokenizer_config='"hello"'), "holds a JSON str"),
    (
        "tokenizer-config-bad-flag",
        lambda t: _folder(t, tokenizer_config='{"add_bos_token": "yes"}'),
        "add_bos_token is yes, expected true or false",
    ),
    ("eos-outside-vocab", lambda t: _folder(t, {**CONFIG, "eos_token_id": 10**6}), "eos_token_id is 1000000"),
    (
        "safetensors-header-too-big",
        lambda t: _folder(t, weights=struct.pack("<Q", 1 << 60) + b"{}"),
        "safetensors header claims",
    ),
    (
        "safetensors-offsets-outside",
        lambda t: _folder(
            t, weights=_safetensors({}, {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}})
        ),
        "outside the file",
    ),
    ("safetensors-overlap", lambda t: _folder(t, weights=_overlapping()), "overlaps"),
]


def _broken_config(tmp_path: Path) -> Path:
    d = _folder(tmp_path)
    (d / "config.json").write_text('{"hidden_size": 64,')
    return d


def _overlapping() -> bytes:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 24


@pytest.mark.parametrize("case, make, match", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", [("show", "{path}"), ("models", "add", "{path}")], ids=["show", "models-add"])
def test_hostile_hf_folder(
    case: str, make: Callable[[Path], Path], match: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    path = make(tmp_path)
    assert_one_line_error(hearth(*(a.format(path=path) for a in command)), match)


def test_broken_tokenizer_json_is_one_line_for_the_torch_engine(tmp_path: Path) -> None:
    from backends.errors import ModelFormatError
    from backends.hf_folder import spec_from_hf_folder

    pytest.importorskip("tokenizers")
    from backends.torch_engine.tokenizer import load_tokenizer

    d = _folder(tmp_path)
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 7}}')
    with pytest.raises(ModelFormatError, match="not a tokenizer the tokenizers library can load"):
        load_tokenizer(spec_from_hf_folder(d))
