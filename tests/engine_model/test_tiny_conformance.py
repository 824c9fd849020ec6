"""Exact conformance: tiny random-weight Llama GGUFs (written by the test) give llama.cpp's logits, through the
ModelRunner's paged path (prefill in one chunk, in chunks on cached blocks, and decodes in a batch)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.api import LoadOptions
from backends.errors import UnsupportedArchitectureError
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.seams import RunnerOutput, ScheduledRequest, SchedulerOutput
from tests.gguf_factory import write_tiny_llama

PROMPT = "The quick brown fox jumps over the lazy dog. def f(x):\n    return x * 42\n"
TOL = {"F32": 1e-3, "Q8_0": 1e-2, "Q4_0": 1e-2}


def _llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, n_threads=2, verbose=False)
    llm.eval(ids)
    out = np.array(llm.scores[:len(ids)])
    llm.close()
    return out


def _runner(path: Path, kernels: str | None = None) -> tuple[ModelRunner, list[int]]:
    from backends.torch_engine.tokenizer import load_tokenizer

    spec = load_spec(path)
    runner = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=4, dtype="float32", n_batch=64), kernels)
    return runner, load_tokenizer(spec).encode(PROMPT)


@pytest.mark.parametrize("weight_type,tied,arch", [
    ("F32", True, "llama"), ("F32", False, "llama"), ("Q8_0", True, "llama"), ("Q4_0", False, "llama"),
    ("F32", True, "qwen2"),  # rotate-half RoPE, no Q/K reorder, QKV biases
])
def test_tiny_gguf_logits_match_llama_cpp(tmp_path: Path, weight_type: str, tied: bool, arch: str) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=weight_type, tied=tied, n_heads=6, n_kv_heads=2,
                            hidden=96, architecture=arch, qkv_bias=arch == "qwen2")
    runner, ids = _runner(path)
    ref = _llama_cpp_logits(path, ids)
    ours = runner.prompt_logits(ids).numpy()
    assert np.abs(ours - ref).max() < TOL[weight_type] * max(1.0, np.abs(ref).max())
    chunked = runner.prompt_logits(ids, chunk=7).numpy()  # chunks of 7 on cached blocks
    assert np.abs(chunked - ref).max() < TOL[weight_type] * max(1.0, np.abs(ref).max())


def test_execute_batches_prefill_chunks_and_decodes_like_one_sequence(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    runner, ids = _runner(path)
    full = runner.prompt_logits(ids)  # (n, vocab), blocks 0.. of the pool
    n = len(ids)
    rng = random.Random(1)
    blocks = list(range(runner.num_blocks))
    rng.shuffle(blocks)
    need = -(-n // 16)
    table_a, table_b = tuple(blocks[:need]), tuple(blocks[need:2 * need])
    cut = n - 3
    # step 1: request a prefills all but 3 tokens; request b prefills 17 tokens (no logits: not at the end)
    step1 = SchedulerOutput((ScheduledRequest("a", tuple(ids[:cut]), 0, table_a, True),
                             ScheduledRequest("b", tuple(ids[:17]), 0, table_b, False)))
    out1: RunnerOutput = runner.execute(step1)
    assert out1.request_ids == ("a",) and out1.logits.dtype == torch.float32
    torch.testing.assert_close(out1.logits[0], full[cut - 1], atol=1e-4, rtol=1e-4)
    # step 2: a decodes one token at a time while b's rest arrives as a chunk on its cached prefix
    step2 = SchedulerOutput((ScheduledRequest("a", (ids[cut],), cut, table_a, True),
                             ScheduledRequest("b", tuple(ids[17:]), 17, table_b, True)))
    out2 = runner.execute(step2)
    assert out2.request_ids == ("a", "b")
    torch.testing.assert_close(out2.logits[0], full[cut], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out2.logits[1], full[n - 1], atol=1e-4, rtol=1e-4)


def test_reference_kernels_agree_with_the_fast_path(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    fast, ids = _runner(path)
    slow, _ = _runner(path, kernels="reference")
    torch.testing.assert_close(slow.prompt_logits(ids[:20], chunk=9), fast.prompt_logits(ids[:20]),
                               atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", architecture="falcon")
    with pytest.raises(UnsupportedArchitectureError, match="llama.cpp"):
        ModelRunner(load_spec(path), LoadOptions(n_ctx=64, max_num_seqs=1))
