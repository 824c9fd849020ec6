"""Mixed precision per layer, weight_quant "int4+attn8" (quantize.MIXED; the plan's "W4A16+attn8"): the attention
projections (qkv_proj, o_proj) int8 per output channel, the MLP's (gate_up_proj, down_proj) int4 in groups, the
head dense as in the other formats; the loader makes it while it reads, quantize_model the same from a dense
model, and torch's packed CPU kernels take both kinds in one model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from backends.api import LoadOptions
from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine.loader import load_model
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quantize import MIXED, QuantConfig, QuantLinear, config_for, quantize_model
from kernels.dispatch import kernel_set
from tests.engine_model.test_quantize_on_load import IDS, _hf_folder, _quant_buffers


@pytest.fixture()
def spec(tmp_path: Path) -> ModelSpec:
    # hidden 128 and FFN 256: int4 groups of 128 everywhere, and shapes torch's packed CPU kernels take
    return load_spec(_hf_folder(tmp_path / "hf", hidden=128, ffn=256, n_layers=2))


def _kinds(model: torch.nn.Module) -> dict[str, str]:
    return {name: m.kind for name, m in model.named_modules() if isinstance(m, QuantLinear)}


def test_config_for_mixed_names_each_modules_kind() -> None:
    cfg = config_for(MIXED)
    assert [cfg.for_module(f"layers.7.attn.{p}").kind for p in ("qkv_proj", "o_proj")] == ["int8", "int8"]
    assert [cfg.for_module(f"layers.7.mlp.{p}").kind for p in ("gate_up_proj", "down_proj")] == ["int4", "int4"]
    assert cfg.for_module("layers.7.attn.qkv_proj").per_module == ()
    assert config_for("int8") == QuantConfig("int8")
    with pytest.raises(ValueError, match="int3"):
        QuantConfig("int4", per_module=(("*.attn.*", "int3"),))


def test_the_loader_makes_attention_int8_and_mlp_int4_as_quantize_model_does(spec: ModelSpec) -> None:
    ops = kernel_set("torch")
    on_load = load_model(spec, ops, torch.bfloat16, torch.device("cpu"), weight_quant=MIXED)
    kinds = _kinds(on_load)
    assert kinds == {
        **{f"layers.{i}.attn.{p}": "int8" for i in range(2) for p in ("qkv_proj", "o_proj")},
        **{f"layers.{i}.mlp.{p}": "int4" for i in range(2) for p in ("gate_up_proj", "down_proj")},
    }
    assert type(on_load.lm_head) is torch.nn.Linear  # the head as the other formats keep it
    assert on_load.layers[0].mlp.down_proj.group_size == 128
    after = quantize_model(load_model(spec, ops, torch.bfloat16, torch.device("cpu")), config_for(MIXED))
    a, b = _quant_buffers(on_load), _quant_buffers(after)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_logits_near_the_dense_models_and_bytes_between_w8a16_and_w4a16(spec: ModelSpec) -> None:
    def runner(weight_quant: str) -> ModelRunner:
        return ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32", weight_quant=weight_quant))

    dense, int8, mixed, int4 = (runner(q) for q in ("none", "int8", MIXED, "int4"))
    assert mixed.describe()["weight_quant"] == "int4+attn8"
    assert int4.weight_bytes < mixed.weight_bytes < int8.weight_bytes < dense.weight_bytes
    ref = dense.prompt_logits(IDS)
    error = {r.weight_quant: (r.prompt_logits(IDS) - ref).abs().max().item() for r in (int8, mixed, int4)}
    # int4's grid moves the logits most; int8 attention takes part of that back
    assert error["int8"] < error[MIXED] < error["int4"] < 0.1 * ref.abs().max().item(), error


def test_the_packed_cpu_kernels_take_both_kinds_in_one_model(spec: ModelSpec) -> None:
    """Each layer packed for torch's CPU kernels (int8: _weight_int8pack_mm, int4: _weight_int4pack_mm_for_cpu)
    gives the generic layout's product within bf16 rounding, and a bf16 CPU runner packs all of them."""
    from kernels.quant_matmul_cpu import cpu_supported

    model = load_model(spec, kernel_set("torch"), torch.bfloat16, torch.device("cpu"), weight_quant=MIXED)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    if not all(cpu_supported(m.weight, torch.bfloat16) for m in layers.values()):
        pytest.skip("this torch build or CPU lacks the packed int4 / int8 kernels")
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for name, layer in layers.items():
        packed = copy.deepcopy(layer)
        assert packed.pack_for_cpu(torch.bfloat16) and packed._cpu.kind == layer.kind, name
        inputs = x if layer.in_features == 128 else torch.cat([x, x], dim=1)
        want, got = layer(inputs).float(), packed(inputs).float()
        assert (got - want).abs().max() <= 2e-2 * want.abs().max(), name
    fast = ModelRunner(spec, LoadOptions(n_ctx=64, max_num_seqs=1, dtype="bfloat16", weight_quant=MIXED))
    assert fast.cpu_packed_layers == 4 * spec.n_layers
    assert fast.describe()["weight_quant"] == "int4+attn8"
    # a decode step runs the packed kernels (the scripted loop where it applies, checked against the eager step);
    # prompt rows take the dense copies: the same token's logits agree within bf16 rounding
    token = int(fast.forward([(IDS, 0, [0])], "last", num_decodes=0).argmax(-1)[0])
    step = fast.forward([([token], len(IDS), [0])], "last", num_decodes=1)[0]
    if fast.model.scripted_decode is not None:
        assert fast.model.scripted_decode.check == {"verdict": "ok", "rows": 1}
    full = fast.prompt_logits([*IDS, token])[-1]
    assert (step - full).abs().max() <= 5e-2 * full.abs().max()


def test_the_planner_prices_the_bytes_a_gpu_holds(spec: ModelSpec) -> None:
    """hwprobe's W4A16+attn8 (memory.torch_mixed_bytes) against a load onto the 'meta' device (what a GPU would
    hold, in bf16): the MLP's int4 groups of 128 exactly (0.5 + 4/128 bytes a weight), the attention's int8 plus
    its 16-bit scale per output row, which the planner leaves out as it does for W8A16."""
    from hwprobe import memory

    model = load_model(spec, kernel_set("torch"), torch.bfloat16, torch.device("meta"), weight_quant=MIXED)
    attention, mlp = memory.torch_mixed_bytes(spec.to_shape())
    for block in model.layers:
        held_attention = sum(m.weight.nbytes for m in (block.attn.qkv_proj, block.attn.o_proj))
        held_mlp = sum(m.weight.nbytes for m in (block.mlp.gate_up_proj, block.mlp.down_proj))
        rows = block.attn.qkv_proj.out_features + block.attn.o_proj.out_features
        assert (held_attention, held_mlp) == (attention + 2 * rows, mlp)
