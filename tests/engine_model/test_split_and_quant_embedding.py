"""Issue 42 item 2, fewer bytes a token: a GGUF's merged projections of mixed kinds are split (split_linear.py),
not requantized to int8; an untied head keeps its blocks on every device; an untied embedding is gathered from its
repacked rows (quant_embedding.py).  Checked on a tiny untied Llama whose types mix like llama.cpp's Q4_K_M (int4
Q and K beside an int8 V, an int4 gate beside an int8 up, an int4 embedding, an int8 head): the split projection
is the dense projection of its parts, the lookup is exact, the logits are the dense model's (and the old layout's
within its requantization), and the planner counts exactly the bytes the engine holds, on a GPU and on the CPU."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from backends.api import LoadOptions
from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine.gguf_repack import requantize_int8
from backends.torch_engine.loader import load_model, quant_module
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quant_embedding import QuantEmbedding
from backends.torch_engine.quantize import QuantLinear
from backends.torch_engine.split_linear import SplitLinear
from hwprobe import memory
from kernels.dispatch import kernel_set
from kernels.quant_matmul import QuantWeight, concat_rows, dequantize, quantize_int4, quantize_int8
from tests.gguf_factory import write_tiny_llama

IDS = [5, 17, 256, 1000, 3, 77, 42, 9000, 12, 600, 31, 4]
# suffix -> GGUF type (the first suffix that matches wins: attn_output before output)
MIXED_TYPES = {
    "attn_q.weight": "Q4_0",  # int4
    "attn_k.weight": "Q4_1",  # int4: stacked with Q into one part
    "attn_v.weight": "Q8_0",  # int8: its own part
    "attn_output.weight": "Q4_1",
    "ffn_gate.weight": "Q4_0",  # int4 beside
    "ffn_up.weight": "Q5_0",  # int8
    "ffn_down.weight": "Q8_0",
    "token_embd.weight": "Q4_0",  # an int4 embedding
    "output.weight": "Q8_0",  # an int8 head
}


def _mixed_spec(tmp_path: Path) -> ModelSpec:
    path = write_tiny_llama(
        tmp_path / "mixed.gguf",
        weight_type="Q8_0",
        tensor_types=MIXED_TYPES,
        tied=False,
        n_heads=4,
        n_kv_heads=2,
        hidden=64,
        ffn=128,
    )
    return load_spec(path)


def _held_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def test_a_split_projection_is_the_dense_projection_of_its_parts() -> None:
    g = torch.Generator().manual_seed(0)
    qk = quantize_int4(torch.randn(48, 64, generator=g), 32, torch.float32)
    v = quantize_int8(torch.randn(16, 64, generator=g), 32, torch.float32)
    bias = torch.randn(64, generator=g)
    split = quant_module([qk, v], bias, None)
    assert (
        isinstance(split, SplitLinear)
        and split.widths == [48, 16]
        and (split.in_features, split.out_features)
        == (
            64,
            64,
        )
    )
    assert torch.equal(split.bias, bias)
    x = torch.randn(2, 3, 64, generator=g)
    want = nn.functional.linear(x, torch.cat([dequantize(qk), dequantize(v)]), bias)
    torch.testing.assert_close(split(x), want)
    assert isinstance(quant_module(qk, None, None), QuantLinear)  # one kind: one QuantLinear


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_quantized_lookup_is_the_dense_lookup_exactly(kind: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    table = torch.randn(100, 96, generator=g)
    w = quantize_int4(table, 32, dtype) if kind == "int4" else quantize_int8(table, 32, dtype)
    embed = QuantEmbedding(w, dtype)
    ids = torch.tensor([[3, 99, 0, 3], [50, 7, 7, 1]])
    got = embed(ids)
    assert got.dtype == dtype and got.shape == (2, 4, 96)
    assert torch.equal(got, dequantize(w).to(dtype)[ids])
    assert embed.nbytes == w.nbytes < table.numel() * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_quantized_lookup_replays_in_a_cuda_graph() -> None:
    """No host sync, no shape that depends on the ids: the lookup captures once and replays for other ids."""
    w = quantize_int4(torch.randn(1000, 256), 32, torch.bfloat16).to("cuda")
    embed = QuantEmbedding(w, torch.bfloat16)
    ids = torch.zeros(8, dtype=torch.int64, device="cuda")
    embed(ids)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = embed(ids)
    ids.copy_(torch.tensor([5, 999, 0, 17, 17, 3, 400, 8]))
    graph.replay()
    assert torch.equal(out, dequantize(w).to(torch.bfloat16)[ids])


def test_the_loader_keeps_each_part_and_both_ends_at_their_own_kinds(tmp_path: Path) -> None:
    spec = _mixed_spec(tmp_path)
    model = load_model(spec, kernel_set("torch"), torch.float32, torch.device("cpu"), weight_quant="gguf")
    for layer in model.layers:
        qkv, gate_up = layer.attn.qkv_proj, layer.mlp.gate_up_proj
        assert isinstance(qkv, SplitLinear) and [(p.kind, p.out_features) for p in qkv.parts] == [
            ("int4", 64 + 32),
            ("int8", 32),
        ]
        assert isinstance(gate_up, SplitLinear) and [(p.kind, p.out_features) for p in gate_up.parts] == [
            ("int4", 128),
            ("int8", 128),
        ]
        assert (layer.attn.o_proj.kind, layer.mlp.down_proj.kind) == ("int4", "int8")
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.kind == "int8"
    assert isinstance(model.embed, QuantEmbedding) and model.embed.kind == "int4"
    shape = spec.to_shape()
    assert (shape.extra["gguf_head_kind"], shape.extra["gguf_embed_kind"]) == ("int8", "int4")


def _previous_layout(model: nn.Module) -> None:
    """The layout before issue 42 item 2, in place: a split projection's int4 parts requantized to int8 and merged
    (gguf_repack.merge_kept as it was), the embedding and the head dense."""
    for layer in model.layers:
        for parent, name in ((layer.attn, "qkv_proj"), (layer.mlp, "gate_up_proj")):
            split = getattr(parent, name)
            parts = [
                p.weight if p.kind == "int8" else requantize_int8(dequantize(p.weight), p.scales.dtype)
                for p in split.parts
            ]
            setattr(parent, name, QuantLinear(concat_rows(parts)))
    model.embed = nn.Embedding.from_pretrained(dequantize(model.embed.weight).to(torch.float32))
    head = nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
    head.weight = nn.Parameter(dequantize(model.lm_head.weight), requires_grad=False)
    model.lm_head = head


def test_logits_are_the_dense_models_and_the_previous_layouts(tmp_path: Path) -> None:
    spec = _mixed_spec(tmp_path)

    def runner(weight_quant: str) -> ModelRunner:
        return ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32", weight_quant=weight_quant))

    new, old, dense = runner("gguf"), runner("gguf"), runner("none")
    _previous_layout(old.model)
    want = dense.prompt_logits(IDS)
    scale = float(want.abs().max())
    new_error = float((new.prompt_logits(IDS) - want).abs().max())
    old_error = float((old.prompt_logits(IDS) - want).abs().max())
    # float32: the file's exact weights either way (Q4_0/Q4_1/Q8_0/Q5_0 repack exactly), so only the order of the
    # sums differs; the old layout adds the int8 requantization of its int4 parts
    assert new_error < 1e-4 * scale, (new_error, scale)
    assert new_error < old_error < 2e-2 * scale, (new_error, old_error, scale)


def test_the_planner_prices_what_a_gpu_holds(tmp_path: Path) -> None:
    """torch_gguf_weights over ModelSpec.to_shape is what load_model(weight_quant="gguf") holds on a GPU (the
    'meta' device, bf16): split layers, an int8 head, an int4 embedding, byte for byte."""
    spec = _mixed_spec(tmp_path)
    model = load_model(spec, kernel_set("torch"), torch.bfloat16, torch.device("meta"), weight_quant="gguf")
    layout = memory.torch_gguf_weights(spec.to_shape())
    assert layout is not None and not layout.tied
    assert list(layout.layer_bytes) == [_held_bytes(b) for b in model.layers]
    assert layout.embedding_bytes == _held_bytes(model.embed)
    assert layout.head_bytes == _held_bytes(model.lm_head)
    assert layout.other_bytes == _held_bytes(model.norm)


def test_the_planner_prices_what_the_cpu_holds(tmp_path: Path) -> None:
    """torch_cpu_weights is what a CPU runner holds in bf16: the packed parts (int4 0.625, int8 1.25 bytes a
    weight), the int8 head packed the same way, the embedding in the generic int4 layout, the dense prompt
    copies."""
    spec = _mixed_spec(tmp_path)
    runner = ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="bfloat16"))
    assert runner.weight_quant == "gguf" and isinstance(runner.model.embed, QuantEmbedding)
    layout = memory.torch_cpu_weights(spec.to_shape(), memory.TORCH_GGUF, psutil.virtual_memory().total)
    rope = _held_bytes(runner.model) - sum(_held_bytes(m) for m in runner.model.children())  # inv_freq: unpriced
    assert runner.int8_head_bytes == 0  # the head is the file's own blocks: no int8 copy
    held = layout.total_bytes
    assert runner.weight_bytes - rope == held, (runner.weight_bytes - rope, held)
    assert runner.dense_copy_bytes == layout.prefill_copy_bytes > 0
    runner.close()


def test_the_prepared_weight_cache_restores_split_layers_and_the_quantized_embedding(tmp_path: Path) -> None:
    spec = _mixed_spec(tmp_path)

    def runner(cache: Path | None) -> ModelRunner:
        options = LoadOptions(
            n_ctx=64,
            max_num_seqs=1,
            dtype="bfloat16",
            weight_quant="gguf",
            weight_cache_dir=str(cache) if cache else None,
        )
        return ModelRunner(spec, options)

    fresh, first, second = runner(None), runner(tmp_path / "cache"), runner(tmp_path / "cache")
    assert (first.weight_cache, second.weight_cache) == ("stored", "hit")
    assert isinstance(second.model.layers[0].attn.qkv_proj, SplitLinear)
    assert isinstance(second.model.embed, QuantEmbedding) and second.weight_bytes == fresh.weight_bytes
    assert torch.equal(second.prompt_logits(IDS), fresh.prompt_logits(IDS))
    decode = [r.forward([(IDS[:1], 0, [0])], num_decodes=1) for r in (fresh, second)]
    assert torch.equal(*decode)


def test_a_tied_model_keeps_the_dense_embedding(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tied.gguf", weight_type="Q8_0", tensor_types=MIXED_TYPES, tied=True)
    spec = load_spec(path)
    model = load_model(spec, kernel_set("torch"), torch.bfloat16, torch.device("cpu"), weight_quant="gguf")
    assert type(model.embed) is nn.Embedding and model.lm_head.weight is model.embed.weight
    assert "gguf_embed_kind" not in spec.to_shape().extra
    layout = memory.torch_gguf_weights(spec.to_shape())
    assert layout is not None and layout.tied and layout.embedding_bytes == _held_bytes(model.embed)


def test_a_quantized_weight_of_another_kind_is_no_embedding() -> None:
    fp8 = QuantWeight("fp8", torch.zeros(4, 32), torch.ones(4, 1), None, 32, 32, 4)
    with pytest.raises(ValueError, match="int4, int8 or q6"):
        QuantEmbedding(fp8, torch.bfloat16)


def test_a_tensor_parallel_cut_keeps_each_part_at_its_kind() -> None:
    """tp/layers.shard_model's column-parallel cut of a split projection: each part keeps the rows of the spans
    inside it, at its own kind, and the cut projection is the dense projection's rows."""
    from backends.torch_engine.tp.layers import _rows_of

    g = torch.Generator().manual_seed(2)
    qk = quantize_int4(torch.randn(96, 64, generator=g), 32, torch.float32)  # Q rows 0-63, K rows 64-95
    v = quantize_int8(torch.randn(32, 64, generator=g), 32, torch.float32)  # V rows 96-127
    spans = [(16, 48), (72, 88), (104, 120)]  # a rank's Q heads, then its K and V heads
    cut = _rows_of(quant_module([qk, v], None, None), spans)
    assert isinstance(cut, SplitLinear) and [(p.kind, p.out_features) for p in cut.parts] == [
        ("int4", 48),
        ("int8", 16),
    ]
    dense = torch.cat([dequantize(qk), dequantize(v)])
    x = torch.randn(3, 64, generator=g)
    torch.testing.assert_close(cut(x), nn.functional.linear(x, torch.cat([dense[lo:hi] for lo, hi in spans])))
