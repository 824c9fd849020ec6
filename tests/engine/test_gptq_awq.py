"""Issue 46: GPTQ and AWQ folders run on the torch engine at their own bits, re-laid into the engine's int4 / int8
layouts with integer ops only (backends/torch_engine/gptq_awq.py).  Checkpoints are packed by
tests/gptq_awq_factory.py from the formats' specification; the reference is the dense float32 model of exactly
the weights each checkpoint stands for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends.api import LoadOptions
from backends.errors import ModelFormatError
from backends.modelspec import load_spec
from backends.quant_config import CheckpointQuant, parse_quant_config, spec_quant
from backends.torch_engine.gptq_awq import AWQ_ORDER, AWQ_REVERSE_ORDER, unpack_awq, unpack_gptq
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quantize import QuantLinear
from kernels.quant_matmul import dequantize
from tests.gptq_awq_factory import Variant, dequant, pack_awq, pack_gptq, quantize_groups, write_dense, write_quantized

pytest.importorskip("safetensors")

VARIANTS = {
    "gptq-asym-g32": Variant(),
    "gptq-v2-sym-g64": Variant(sym=True, group_size=64, checkpoint_format="gptq_v2"),
    "gptq-v2-asym-g32": Variant(checkpoint_format="gptq_v2"),
    "gptq-actorder-g32": Variant(act_order=True),
    "gptq-perchannel": Variant(group_size=-1),
    "gptq-8bit-sym": Variant(bits=8, sym=True),
    "awq-g32": Variant(method="awq"),
    "awq-g64": Variant(method="awq", group_size=64),
}
IDS = list(range(3, 40))  # a prompt of token ids (the tiny vocabulary has 256)


def _unpack(parts: dict[str, torch.Tensor], quant: CheckpointQuant, where: str = "m"):
    if quant.method == "awq":
        return unpack_awq(parts, quant), None
    return unpack_gptq(parts, quant, where)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_unpacked_weights_are_the_checkpoints_exactly(name: str, tmp_path: Path) -> None:
    """Every projection's int4 / int8 weights dequantize to exactly what the format's kernels compute."""
    from safetensors.torch import load_file

    folder, ref = write_quantized(tmp_path / "m", VARIANTS[name])
    spec = load_spec(folder)
    quant = spec_quant(spec.path, spec.metadata)
    assert quant is not None and spec.file_type == quant.label
    tensors = load_file(str(folder / "model.safetensors"))
    for weight in (n for n in ref if n.endswith("proj.weight")):
        prefix = weight.removesuffix(".weight")
        parts = {k.rsplit(".", 1)[1]: t for k, t in tensors.items() if k.startswith(prefix + ".")}
        qw, perm = _unpack(parts, quant, prefix)
        assert qw.kind == ("int8" if quant.bits == 8 else "int4")
        want = ref[weight] if perm is None else ref[weight][:, perm]
        assert torch.equal(dequantize(qw), want), weight
        assert (perm is not None) == (VARIANTS[name].act_order)


def test_gptq_classic_zero_wraps_as_autogptq_kernels_read_it() -> None:
    """The classic format stores zero - 1: a zero point of 0 is stored as nibble 15 and every GPTQ kernel adds 1
    back, computing with 16.  hearth does the same (its float offset holds -16 * scale), not a guessed 0."""
    q = torch.randint(0, 16, (8, 32))
    scales = torch.full((8, 1), 0.5, dtype=torch.float16)
    zeros = torch.zeros(8, 1, dtype=torch.int64)
    g_idx = torch.zeros(32, dtype=torch.int64)
    packed = pack_gptq(q, scales, zeros, g_idx, 4, "gptq")
    quant = CheckpointQuant("gptq", 4, 32, False, False, 1)
    qw, _ = unpack_gptq(packed, quant, "m")
    assert torch.equal(dequantize(qw), dequant(q, scales, torch.full_like(zeros, 16), g_idx))
    v2, _ = unpack_gptq(
        pack_gptq(q, scales, zeros, g_idx, 4, "gptq_v2"), CheckpointQuant("gptq", 4, 32, False, False, 0), "m"
    )
    assert torch.equal(dequantize(v2), dequant(q, scales, zeros, g_idx))


def test_awq_column_order() -> None:
    """AWQ's nibble i holds output column AWQ_ORDER[i]: one nonzero column at a time lands in the right row."""
    assert [AWQ_ORDER[AWQ_REVERSE_ORDER[c]] for c in range(8)] == list(range(8))
    quant = CheckpointQuant("awq", 4, 32, False, False, 0)
    for col in range(16):
        q = torch.zeros(16, 32, dtype=torch.int64)
        q[col] = 7
        scales = torch.ones(16, 1, dtype=torch.float16)
        zeros = torch.zeros(16, 1, dtype=torch.int64)
        packed = pack_awq(q, scales, zeros)
        nibbles = [(int(packed["qweight"][0, col // 8]) >> (4 * i)) & 15 for i in range(8)]
        assert nibbles.index(7) == AWQ_REVERSE_ORDER[col % 8]
        w = dequantize(unpack_awq(packed, quant))
        assert torch.nonzero(w.abs().sum(1)).flatten().tolist() == [col]


def _runner(folder: Path, dtype: str) -> ModelRunner:
    return ModelRunner(load_spec(folder), LoadOptions(n_ctx=64, max_num_seqs=1, dtype=dtype, n_threads=2))


@pytest.mark.parametrize("name", ["gptq-asym-g32", "gptq-actorder-g32", "gptq-8bit-sym", "awq-g32", "gptq-perchannel"])
def test_engine_logits_match_the_dequantized_model(name: str, tmp_path: Path) -> None:
    """float32 engine: the quantized layers' reference path against the dense model of the same weights (only
    summation order differs); bf16: torch's packed CPU int4 / int8 kernels, within their bf16 tolerance."""
    folder, ref = write_quantized(tmp_path / "q", VARIANTS[name])
    dense = _runner(write_dense(tmp_path / "dense", ref), "float32").prompt_logits(IDS)
    quant = _runner(folder, "float32")
    layers = [m for m in quant.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down per layer; the head stays dense
    assert quant.describe()["weight_quant"] == load_spec(folder).file_type
    torch.testing.assert_close(quant.prompt_logits(IDS), dense, atol=2e-4, rtol=1e-4)
    bf16 = _runner(folder, "bfloat16")
    if hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):  # every layer on torch's packed CPU kernels
        assert bf16.cpu_packed_layers == len(layers)
    err = (bf16.prompt_logits(IDS) - dense).abs().max()
    assert err < 0.03 * dense.abs().max(), float(err)


def test_act_order_permutes_inputs_once(tmp_path: Path) -> None:
    """Act-order layers hold one input permutation (QuantLinear.input_perm); merged Q/K/V share theirs."""
    folder, _ = write_quantized(tmp_path / "q", VARIANTS["gptq-actorder-g32"])
    runner = _runner(folder, "float32")
    layer = runner.model.layers[0]
    for proj in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert proj.input_perm is not None and sorted(proj.input_perm.tolist()) == list(range(proj.in_features))


def test_side_file_config(tmp_path: Path) -> None:
    """AutoGPTQ's quantize_config.json instead of config.json's quantization_config."""
    folder, ref = write_quantized(tmp_path / "q", Variant(sym=True), side_file=True)
    spec = load_spec(folder)
    assert spec.file_type == "GPTQ-4bit-g32"
    dense = _runner(write_dense(tmp_path / "dense", ref), "float32").prompt_logits(IDS[:8])
    torch.testing.assert_close(_runner(folder, "float32").prompt_logits(IDS[:8]), dense, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ 3-bit"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "marlin"),
        ({"bits": 4, "group_size": 128, "is_marlin_format": True}, "marlin"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "AWQ version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "exllama"}, "AWQ version 'exllama'"),
        ({"quant_method": "exl2", "bits": 4.0}, "EXL2"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
        ({"quant_method": "gptq", "bits": "4", "group_size": 128}, "bits is '4', expected an integer"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size is 0"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 1 << 30}, "group_size is 1073741824"),
        ({"quant_method": "gptq", "bits": 4, "desc_act": "yes"}, "desc_act is 'yes'"),
        ([1, 2], "JSON list"),
    ],
)
def test_unsupported_or_malformed_config_is_one_line(cfg: object, match: str) -> None:
    with pytest.raises(ModelFormatError, match=match):
        parse_quant_config(cfg, "config.json")


def test_quantize_groups_roundtrip_is_within_half_a_step() -> None:
    """The factory's quantizer itself (so the engine tests are about real 4-bit weights)."""
    w = torch.randn(16, 64)
    q, s, z = quantize_groups(w, 32, 4, sym=False)
    back = dequant(q, s, z, torch.arange(64) // 32)
    assert ((back - w).abs() <= s.float().repeat_interleave(32, 1) * 0.51 + 1e-6).all()
