"""A Hugging Face safetensors folder loads to the same model as the GGUF it was made from: the HF name map,
the merged projections and the undone Q/K reorder agree (the GGUF path itself is checked against llama.cpp)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.tokenizer import load_tokenizer
from tests.gguf_factory import write_tiny_llama
from tests.hf_export import hf_config, hf_state


def _hf_folder_from(runner: ModelRunner, gguf_tok, folder: Path) -> None:
    """Write the runner's weights under Hugging Face names (tests/hf_export.py), its config and tokenizer."""
    from safetensors.torch import save_file

    sd = hf_state(runner.model, "llama")
    folder.mkdir()
    save_file({k: v.detach().float().contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config(runner.model.cfg, "llama")))
    gguf_tok._tk.save(str(folder / "tokenizer.json"))


def test_hf_folder_matches_its_gguf(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_heads=4, n_kv_heads=2)
    opts = LoadOptions(n_ctx=64, max_num_seqs=2, dtype="float32")
    spec = load_spec(path)
    gguf_runner = ModelRunner(spec, opts)
    tok = load_tokenizer(spec)
    _hf_folder_from(gguf_runner, tok, tmp_path / "hf")
    hf_spec = load_spec(tmp_path / "hf")
    hf_runner = ModelRunner(hf_spec, opts)
    text = "Hello there, 123 tokens <|im_end|> ok"
    ids = tok.encode(text)
    assert load_tokenizer(hf_spec).encode(text) == ids
    torch.testing.assert_close(hf_runner.prompt_logits(ids), gguf_runner.prompt_logits(ids), atol=1e-5, rtol=1e-5)


def test_int8_weight_only_stays_close(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    spec = load_spec(path)
    ids = load_tokenizer(spec).encode("The quick brown fox jumps over the lazy dog")
    dense = ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32")).prompt_logits(ids)
    int8 = ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32", weight_quant="int8"))
    assert type(int8.model.layers[0].mlp.down_proj).__name__ == "QuantLinear"
    assert (int8.prompt_logits(ids) - dense).abs().max() < 0.05 * dense.abs().max()
