"""Mistral: a Hugging Face MistralForCausalLM folder with a sliding_window (Mistral 7B v0.1: 4096) runs every
layer windowed; the same weights as a llama GGUF (llama.cpp's converter writes no window for them, and llama.cpp
applies none) run full attention.  Positions inside the window agree between the two, later ones do not."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.tokenizer import load_tokenizer
from tests.engine_model.test_hf_folder import _hf_folder_from
from tests.gguf_factory import write_tiny_llama

WINDOW = 8


def test_mistral_folder_slides_every_layer(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_heads=4, n_kv_heads=2)
    opts = LoadOptions(n_ctx=64, max_num_seqs=2, dtype="float32")
    spec = load_spec(path)
    full = ModelRunner(spec, opts)
    tok = load_tokenizer(spec)
    folder = tmp_path / "hf"
    _hf_folder_from(full, tok, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], sliding_window=WINDOW)
    (folder / "config.json").write_text(json.dumps(config))
    mistral = ModelRunner(load_spec(folder), opts)
    assert [layer.attn.window for layer in mistral.model.layers] == [WINDOW] * spec.n_layers
    assert all(layer.attn.window == 0 for layer in full.model.layers)
    ids = tok.encode("The quick brown fox jumps over the lazy dog. def f(x):\n    return x * 42  # and again\n")
    assert len(ids) > 2 * WINDOW
    windowed, plain = mistral.prompt_logits(ids), full.prompt_logits(ids)
    torch.testing.assert_close(windowed[:WINDOW], plain[:WINDOW], atol=1e-5, rtol=1e-5)
    assert (windowed[WINDOW:] - plain[WINDOW:]).abs().amax(dim=-1).min() > 1e-4  # every later row moved
    reference = ModelRunner(load_spec(folder), opts, kernels="reference")
    torch.testing.assert_close(reference.prompt_logits(ids, chunk=5), windowed, atol=1e-4, rtol=1e-4)
