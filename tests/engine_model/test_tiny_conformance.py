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
    from backends.llama_cpp.backend import open_llama

    llm = open_llama(str(path), logits_all=True, n_ctx=128, n_threads=2, verbose=False)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)])
    llm.close()
    return out


def _runner(path: Path, kernels: str | None = None) -> tuple[ModelRunner, list[int]]:
    from backends.torch_engine.tokenizer import load_tokenizer

    spec = load_spec(path)
    runner = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=4, dtype="float32", n_batch=64), kernels)
    return runner, load_tokenizer(spec).encode(PROMPT)


@pytest.mark.parametrize(
    "weight_type,tied,arch",
    [
        ("F32", True, "llama"),
        ("F32", False, "llama"),
        ("Q8_0", True, "llama"),
        ("Q4_0", False, "llama"),
        ("F32", True, "qwen2"),  # rotate-half RoPE, no Q/K reorder, QKV biases
    ],
)
def test_tiny_gguf_logits_match_llama_cpp(tmp_path: Path, weight_type: str, tied: bool, arch: str) -> None:
    path = write_tiny_llama(
        tmp_path / "tiny.gguf",
        weight_type=weight_type,
        tied=tied,
        n_heads=6,
        n_kv_heads=2,
        hidden=96,
        architecture=arch,
        qkv_bias=arch == "qwen2",
    )
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
    table_a, table_b = tuple(blocks[:need]), tuple(blocks[need : 2 * need])
    cut = n - 3
    # step 1: request a prefills all but 3 tokens; request b prefills 17 tokens (no logits: not at the end)
    step1 = SchedulerOutput(
        (
            ScheduledRequest("a", tuple(ids[:cut]), 0, table_a, True),
            ScheduledRequest("b", tuple(ids[:17]), 0, table_b, False),
        )
    )
    out1: RunnerOutput = runner.execute(step1)
    assert out1.request_ids == ("a",) and out1.logits.dtype == torch.float32
    torch.testing.assert_close(out1.logits[0], full[cut - 1], atol=1e-4, rtol=1e-4)
    # step 2: a decodes one token at a time while b's rest arrives as a chunk on its cached prefix
    step2 = SchedulerOutput(
        (
            ScheduledRequest("a", (ids[cut],), cut, table_a, True),
            ScheduledRequest("b", tuple(ids[17:]), 17, table_b, True),
        )
    )
    out2 = runner.execute(step2)
    assert out2.request_ids == ("a", "b")
    torch.testing.assert_close(out2.logits[0], full[cut], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out2.logits[1], full[n - 1], atol=1e-4, rtol=1e-4)


def test_reference_kernels_agree_with_the_fast_path(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    fast, ids = _runner(path)
    slow, _ = _runner(path, kernels="reference")
    torch.testing.assert_close(
        slow.prompt_logits(ids[:20], chunk=9), fast.prompt_logits(ids[:20]), atol=1e-4, rtol=1e-4
    )


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", architecture="falcon")
    with pytest.raises(UnsupportedArchitectureError, match="llama.cpp"):
        ModelRunner(load_spec(path), LoadOptions(n_ctx=64, max_num_seqs=1))


@pytest.mark.parametrize("weight_type,arch", [("Q4_0", "llama"), ("Q4_1", "llama"), ("Q4_1", "qwen2")])
def test_gguf_4bit_blocks_kept_quantized_give_llama_cpp_logits(tmp_path: Path, weight_type: str, arch: str) -> None:
    """weight_quant="gguf": the projections stay the file's 4-bit blocks (repacked, Q/K rows un-reordered for
    llama) and still give llama.cpp's logits: exactly through the float32 reference matmul, and through torch's
    packed int4 CPU kernel in bf16 within bf16's rounding."""
    from backends.torch_engine.quantize import QuantLinear

    path = write_tiny_llama(
        tmp_path / "tiny.gguf",
        weight_type=weight_type,
        tied=False,
        n_heads=6,
        n_kv_heads=2,
        hidden=96,
        architecture=arch,
        qkv_bias=arch == "qwen2",
    )
    spec = load_spec(path)
    from backends.torch_engine.tokenizer import load_tokenizer

    ids = load_tokenizer(spec).encode(PROMPT)
    ref = _llama_cpp_logits(path, ids)
    scale = max(1.0, np.abs(ref).max())
    exact = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="float32", weight_quant="gguf"))
    projections = [m for m in exact.model.modules() if isinstance(m, QuantLinear)]
    assert len(projections) == 4 * spec.n_layers + 1  # qkv, o, gate_up, down per layer, and the (Q4) lm head
    assert isinstance(exact.model.lm_head, QuantLinear)
    assert all(m.kind == "int4" and m.group_size == 32 for m in projections)
    assert exact.cpu_packed_layers == 0  # fp32 activations: the reference path
    assert np.abs(exact.prompt_logits(ids).numpy() - ref).max() < 1e-2 * scale
    fast = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="bfloat16"))  # auto -> gguf on CPU
    assert fast.weight_quant == "gguf" and fast.cpu_packed_layers == 4 * spec.n_layers + 1
    dense = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="bfloat16", weight_quant="none"))
    assert fast.weight_bytes < dense.weight_bytes
    ours, theirs = fast.prompt_logits(ids).numpy(), dense.prompt_logits(ids).numpy()
    # measured: max |fast - ref| 0.009-0.013 of the logit range, the same as the dense bf16 model's own error
    assert np.abs(ours - ref).max() < 5e-2 * scale
    assert np.abs(ours - ref).max() < 2 * np.abs(theirs - ref).max() + 1e-2 * scale


def test_gguf_5bit_blocks_kept_as_int8_give_llama_cpp_logits(tmp_path: Path) -> None:
    """Q5_0 projections (exact as int8) with a Q5_1 V merged into Q/K/V and a Q5_1 head (both requantized to
    int8 per 32, gguf_repack.REQUANTIZED): every projection stays quantized, on the packed CPU kernels in bf16,
    and the logits stay llama.cpp's within the dense model's own rounding; the planner prices the head as int8."""
    from backends.torch_engine.quantize import QuantLinear
    from backends.torch_engine.tokenizer import load_tokenizer

    path = write_tiny_llama(
        tmp_path / "tiny.gguf",
        weight_type="Q8_0",
        tensor_types={
            "attn_q.weight": "Q5_0",
            "attn_k.weight": "Q5_0",
            "attn_v.weight": "Q5_1",
            "ffn_gate.weight": "Q5_0",
            "ffn_up.weight": "Q5_0",
            "ffn_down.weight": "Q5_0",
            "output.weight": "Q5_1",
        },
        tied=False,
        n_heads=6,
        n_kv_heads=2,
        hidden=96,
    )
    spec = load_spec(path)
    assert spec.to_shape().extra["gguf_head_kind"] == "int8"
    ids = load_tokenizer(spec).encode(PROMPT)
    ref = _llama_cpp_logits(path, ids)
    scale = max(1.0, np.abs(ref).max())
    exact = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="float32", weight_quant="gguf"))
    projections = [m for m in exact.model.modules() if isinstance(m, QuantLinear)]
    assert len(projections) == 4 * spec.n_layers + 1
    assert all(m.kind == "int8" and m.group_size == 32 for m in projections)
    # float32: the file's exact weights (dense) against the int8 ones; llama.cpp's own 8-bit activations make
    # most of either's difference
    exact_dense = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="float32", weight_quant="none"))
    dense_error = np.abs(exact_dense.prompt_logits(ids).numpy() - ref).max()
    # measured (AMD EPYC): 0.0147 int8 against 0.0089 dense, of logits up to 1.0
    assert np.abs(exact.prompt_logits(ids).numpy() - ref).max() < 2 * dense_error + 2e-3 * scale
    fast = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="bfloat16"))
    assert fast.weight_quant == "gguf" and fast.cpu_packed_layers == 4 * spec.n_layers + 1
    dense = ModelRunner(spec, LoadOptions(n_ctx=128, max_num_seqs=2, dtype="bfloat16", weight_quant="none"))
    ours, theirs = fast.prompt_logits(ids).numpy(), dense.prompt_logits(ids).numpy()
    assert np.abs(ours - ref).max() < 2 * np.abs(theirs - ref).max() + 1e-2 * scale
