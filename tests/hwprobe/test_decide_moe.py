"""decide() for a MoE GGUF that does not fit a 24 GB card: the plan's expert placement becomes llama.cpp's
LoadOptions (every layer on the GPU, cpu_expert_layers for the tensor buffer overrides), from the file's own
expert bytes; a user's --n-gpu-layers means plain layer offload."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.loading import decide
from app.settings import Settings
from backends.modelspec import TensorSpec
from tests.fakes import fake_spec

FIXTURES = Path(__file__).parent / "fixtures"
Q4_0 = 18 / 32


def mixtral_q4_0_spec():
    """Mixtral-8x7B's shapes as a Q4_0 GGUF with no file behind it (stacked experts as llama.cpp stores them)."""
    h, f, e, n, vocab, kv = 4096, 14336, 8, 32, 32000, 1024

    def t(name: str, *dims: int, bpw: float = Q4_0) -> TensorSpec:
        count = 1
        for d in dims:
            count *= d
        return TensorSpec(name, "Q4_0" if bpw == Q4_0 else "F32", tuple(reversed(dims)), int(count * bpw), count)

    tensors = [t("token_embd.weight", vocab, h), t("output.weight", vocab, h), t("output_norm.weight", h, bpw=4)]
    for i in range(n):
        b = f"blk.{i}."
        tensors += [
            t(b + "attn_q.weight", h, h),
            t(b + "attn_k.weight", kv, h),
            t(b + "attn_v.weight", kv, h),
            t(b + "attn_output.weight", h, h),
            t(b + "attn_norm.weight", h, bpw=4),
            t(b + "ffn_norm.weight", h, bpw=4),
            t(b + "ffn_gate_inp.weight", e, h, bpw=4),
            t(b + "ffn_gate_exps.weight", e, f, h),
            t(b + "ffn_up_exps.weight", e, f, h),
            t(b + "ffn_down_exps.weight", e, h, f),
        ]
    return dataclasses.replace(
        fake_spec(name="Mixtral-8x7B-Q4_0"),
        n_layers=n,
        hidden_size=h,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        ffn_size=f,
        vocab_size=vocab,
        context_length=32768,
        n_experts=e,
        n_experts_used=2,
        file_type="Q4_0",
        tensors=tuple(tensors),
        param_count=sum(x.n_elements for x in tensors),
        tied_embeddings=False,
        tokenizer_model="llama",
        tokenizer_pre="",
    )


def test_the_file_knows_its_expert_bytes() -> None:
    shape = mixtral_q4_0_spec().to_shape()
    assert len(shape.expert_bytes) == 32 and shape.expert_bytes[0] == int(8 * 14336 * 4096 * Q4_0) * 3
    assert all(e < b for e, b in zip(shape.expert_bytes, shape.layer_bytes))


def test_expert_placement_becomes_llama_cpp_options() -> None:
    d = decide(mixtral_q4_0_spec(), Settings(), str(FIXTURES / "rtx4090_24gb.json"))
    assert d.backend == "llama.cpp" and d.plan.n_gpu_layers == 32 and d.plan.cpu_expert_layers > 0
    assert d.options.n_gpu_layers == -1 and d.options.cpu_expert_layers == d.plan.cpu_expert_layers
    assert any(r.startswith("MoE placement") for r in d.reasons)


def test_a_fixed_n_gpu_layers_is_plain_layer_offload() -> None:
    d = decide(mixtral_q4_0_spec(), Settings(n_gpu_layers=20), str(FIXTURES / "rtx4090_24gb.json"))
    assert d.options.n_gpu_layers == 20 and d.options.cpu_expert_layers == 0
