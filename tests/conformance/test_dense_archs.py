"""Conformance of every dense architecture family the torch engine runs (Qwen3, Gemma 3, Phi-3; Llama and Qwen2
are tests/engine_model/test_tiny_conformance.py): a tiny random-weight GGUF of each, written with gguf's writer
(tests/arch_factory.py), run by llama.cpp and by the torch engine.

- Logits within the llama-family test's tolerance (1e-3 of the logit range for F32, 1e-2 for F16), whole
  prompt and in chunks of 7 on cached blocks (the paged path a server runs).
- Greedy replies equal, except from a near-tie (tests/greedy_agreement: at float32's tolerance here).
- The Hugging Face layout of the same weights (safetensors + config.json) gives the GGUF's logits: the HF name
  maps, Gemma's (1 + w) norm offset, Phi-3's fused tensors and the configs' own keys agree.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.tokenizer import load_tokenizer
from tests.arch_factory import write_tiny_arch
from tests.greedy_agreement import assert_backends_agree
from tests.hf_export import hf_config, hf_state

PROMPT = "The quick brown fox jumps over the lazy dog. def f(x):\n    return x * 42\n"
# F16: llama.cpp rounds the activations to f16 for its f16 matmuls (measured: 0.007 of Gemma's 5.3 logit range).
# No Q8_0 case here: ggml also quantizes the activations to 8 bits, and over 23 x 49152 logits of these random
# models the largest gap reached 1-2.4 % of the range (qwen3/phi3 0.0102 of 1.01, gemma3 0.125 of 5.35); the
# starter (tests/engine_model) and Gemma 3 270M (test_gemma3_270m.py) check quantized files.
TOL = {"F32": 1e-3, "F16": 1e-2}

# head_dim apart from hidden / heads (Qwen3), a 6-layer Gemma (5 sliding layers of window 8, then a global
# one: the 23-token prompt crosses the window), Phi with partial rotary (16 of 24 dims) and fused tensors
SHAPES = {
    "qwen3": dict(hidden=96, n_heads=4, n_kv_heads=2, head_dim=32),
    "gemma3": dict(hidden=96, n_heads=4, n_kv_heads=1, head_dim=32, n_layers=6, sliding_window=8, rope_base=1e6),
    "phi3": dict(hidden=96, n_heads=4, n_kv_heads=2, rope_dim=16),
}


def _llama_cpp(path: Path) -> object:
    from backends.llama_cpp.backend import open_llama

    return open_llama(str(path), logits_all=True, n_ctx=128, n_threads=2, verbose=False)


def _llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = _llama_cpp(path)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)])
    llm.close()
    return out


def _runner(path: Path, kernels: str | None = None) -> ModelRunner:
    return ModelRunner(load_spec(path), LoadOptions(n_ctx=128, max_num_seqs=4, dtype="float32", n_batch=64), kernels)


def _ids(path: Path) -> list[int]:
    return load_tokenizer(load_spec(path)).encode(PROMPT)


@pytest.mark.parametrize("arch,weight_type", [("qwen3", "F32"), ("gemma3", "F32"), ("phi3", "F32"), ("gemma3", "F16")])
def test_tiny_gguf_logits_match_llama_cpp(tmp_path: Path, arch: str, weight_type: str) -> None:
    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, weight_type=weight_type, **SHAPES[arch])
    ids = _ids(path)
    ref = _llama_cpp_logits(path, ids)
    runner = _runner(path)
    limit = TOL[weight_type] * max(1.0, float(np.abs(ref).max()))
    assert np.abs(runner.prompt_logits(ids).numpy() - ref).max() < limit
    assert np.abs(runner.prompt_logits(ids, chunk=7).numpy() - ref).max() < limit


@pytest.mark.parametrize("original", [64, 256])
def test_phi3_longrope_factors_follow_llama_cpps_rule(tmp_path: Path, original: int) -> None:
    """Contexts past the original one take the long factors, others the short; cos/sin carry the attention
    factor (the engine and llama.cpp both run n_ctx 128 here: original 64 -> long, 256 -> short)."""
    path = write_tiny_arch(tmp_path / "phi3.gguf", "phi3", longrope_original=original, **SHAPES["phi3"])
    ids = _ids(path)
    ref = _llama_cpp_logits(path, ids)
    runner = _runner(path)
    assert runner.model.cfg.rope_attn_factor == pytest.approx(1.19)
    limit = TOL["F32"] * max(1.0, float(np.abs(ref).max()))
    assert np.abs(runner.prompt_logits(ids).numpy() - ref).max() < limit


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_greedy_replies_match_llama_cpp(tmp_path: Path, arch: str) -> None:
    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, **SHAPES[arch])
    prompt = _ids(path)[:12]
    llm = _llama_cpp(path)
    llm.eval(prompt)
    theirs, rows = [], []
    for _ in range(12):
        row = np.array(llm.scores[llm.n_tokens - 1])
        rows.append(row)
        theirs.append(int(row.argmax()))
        llm.eval([theirs[-1]])
    llm.close()
    runner = _runner(path)
    ours: list[int] = []
    for _ in range(12):
        ours.append(int(runner.prompt_logits(prompt + ours)[-1].argmax()))
    # only a near-tie may part the replies (then they stop agreeing): the two engines' margins over the pair
    # within twice the float32 logits tolerance, the most a pair's gap moves when each logit moves that much
    tie = 2 * TOL["F32"] * max(1.0, float(np.abs(np.array(rows)).max()))
    assert_backends_agree(
        ours,
        theirs,
        prompt,
        {"torch": lambda ids: runner.prompt_logits(ids).numpy(), "llama.cpp": lambda ids: _llama_cpp_logits(path, ids)},
        tie,
    )


def test_gemma3_sliding_window_is_what_llama_cpp_computes(tmp_path: Path) -> None:
    """The window matters on this prompt: the same model with full attention everywhere is far off."""
    path = write_tiny_arch(tmp_path / "gemma3.gguf", "gemma3", **SHAPES["gemma3"])
    ids = _ids(path)
    ref = _llama_cpp_logits(path, ids)
    runner = _runner(path)
    windows = [layer.attn.window for layer in runner.model.layers]
    assert windows == [8, 8, 8, 8, 8, 0]
    for layer in runner.model.layers:
        layer.attn.window = 0
    full = runner.prompt_logits(ids).numpy()
    assert np.abs(full - ref).max() > 10 * TOL["F32"] * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_reference_kernels_agree_with_the_fast_path(tmp_path: Path, arch: str) -> None:
    """The reference path (windowed attention, GeGLU in float64, partial rotary) equals the fast one."""
    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, **SHAPES[arch])
    ids = _ids(path)[:20]
    fast, slow = _runner(path), _runner(path, kernels="reference")
    torch.testing.assert_close(slow.prompt_logits(ids, chunk=9), fast.prompt_logits(ids), atol=1e-4, rtol=1e-4)


# -- the Hugging Face layout of the same weights ------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_hf_folder_matches_its_gguf(tmp_path: Path, arch: str) -> None:
    from safetensors.torch import save_file

    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, **SHAPES[arch])
    gguf_runner = _runner(path)
    folder = tmp_path / "hf"
    folder.mkdir()
    sd = hf_state(gguf_runner.model, arch)
    save_file({k: v.detach().float().contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config(gguf_runner.model.cfg, arch)))
    tok = load_tokenizer(load_spec(path))
    tok._tk.save(str(folder / "tokenizer.json"))
    hf_runner = _runner(folder)
    hf_cfg, gguf_cfg = hf_runner.model.cfg, gguf_runner.model.cfg
    assert dataclasses.replace(hf_cfg, rope_scaling={}) == dataclasses.replace(gguf_cfg, rope_scaling={})
    ids = tok.encode(PROMPT)
    torch.testing.assert_close(hf_runner.prompt_logits(ids), gguf_runner.prompt_logits(ids), atol=1e-5, rtol=1e-5)


def test_gemma3_multimodal_folder_loads_its_language_model(tmp_path: Path) -> None:
    """Gemma3ForConditionalGeneration (4B and up): the text model's tensors under "language_model.", its config
    under text_config, a vision tower beside them that the text engine skips."""
    from safetensors.torch import save_file

    path = write_tiny_arch(tmp_path / "gemma3.gguf", "gemma3", **SHAPES["gemma3"])
    gguf_runner = _runner(path)
    folder = tmp_path / "hf"
    folder.mkdir()
    sd = {"language_model." + k: v for k, v in hf_state(gguf_runner.model, "gemma3").items()}
    sd["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.ones(4, 3, 2, 2)
    save_file({k: v.detach().float().contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    text = hf_config(gguf_runner.model.cfg, "gemma3")
    text.pop("architectures")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Gemma3ForConditionalGeneration"],
                "model_type": "gemma3",
                "text_config": text,
                "vision_config": {"hidden_size": 4},
            }
        )
    )
    tok = load_tokenizer(load_spec(path))
    tok._tk.save(str(folder / "tokenizer.json"))
    ids = tok.encode(PROMPT)
    torch.testing.assert_close(_runner(folder).prompt_logits(ids), gguf_runner.prompt_logits(ids), atol=1e-5, rtol=1e-5)
