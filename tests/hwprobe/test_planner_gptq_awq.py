"""Issue 46 item 2: the planner plans a GPTQ / AWQ folder in its own format only (the label, "GPTQ-4bit-g128"),
at the bytes the torch engine holds once it has loaded it, never as 16-bit weights, never re-quantized, never on
llama.cpp (GGUF only).  The bytes are checked against the loaded QuantLinear layers of tiny checkpoints
(tests/gptq_awq_factory.py).

Hand arithmetic for Llama-2-13B GPTQ-4bit-g128 on a GPU: 40 blocks of 317.2 M projection weights x (0.5 + 4/128)
bytes = 6.28 GiB, + two 16-bit 32000 x 5120 tables 0.61 GiB = 6.89 GiB (bf16 would be 24.2).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_13B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.quality import format_quality
from hwprobe.report import load_report

FIXTURES = Path(__file__).parent / "fixtures"
PROJ_13B = 4 * 5120 * 5120 + 3 * 5120 * 13824


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def gptq_13b(label: str = "GPTQ-4bit-g128", bits: int = 4) -> object:
    """Llama-2-13B as ModelSpec.to_shape gives a GPTQ folder (backends.quant_config.planner_extra)."""
    layers = ((PROJ_13B, PROJ_13B // 128, 0),) * 40
    cq = {"label": label, "bits": bits, "per_channel": False, "layers": layers}
    return dataclasses.replace(LLAMA2_13B, tokenizer="hf", extra={"file_format": "safetensors", m.CHECKPOINT_QUANT: cq})


@pytest.mark.parametrize("fixture", ["rtx4090_24gb", "rtx3090_24gb", "2x3090_nvlink"])
def test_13b_gptq_on_24gb_cards_runs_its_own_int4_on_one_gpu(fixture: str) -> None:
    p = plan(hw(fixture), gptq_13b())
    assert (p.backend, p.quant, p.tensor_parallel) == ("torch", "GPTQ-4bit-g128", 1)
    assert p.device in ("cuda:0", "cuda:1")  # one GPU (the one with most budget): no split of a checkpoint yet
    used = [d for d in p.devices if d.kind == "gpu" and d.weights_mib]
    assert len(used) == 1 and 7_000 < used[0].weights_mib < 7_100  # 6.89 GiB: its int4 bytes, not bf16's 24.2
    assert [(c.backend, c.quant) for c in p.candidates] == [("torch", "GPTQ-4bit-g128")]  # no bf16, no llama.cpp
    assert any("GPTQ-4bit-g128, the folder's own packed integers" in r for r in p.reasons)
    assert p.candidates[0].ppl_increase_pct == 7.3 and "GPTQ 5.87" in p.candidates[0].quality_source


def test_checkpoint_quality_defaults_and_measured_records_win() -> None:
    assert format_quality("AWQ-4bit-g128", "torch", None).pct == 2.4
    assert format_quality("GPTQ-8bit-perchannel", "torch", None).pct == 0.2
    measured = format_quality("GPTQ-4bit-g128", "torch", None, {"GPTQ-4bit-g128": (1.1, "hearth ppl --compare")})
    assert (measured.pct, measured.source) == (1.1, "measured: hearth ppl --compare")


@pytest.mark.parametrize(
    "variant",
    [
        {"act_order": True},
        {"group_size": -1},
        {"bits": 8, "sym": True},
        {"method": "awq"},
    ],
)
def test_planned_bytes_are_the_loaded_bytes(variant: dict, tmp_path: Path) -> None:
    """Per block, the planner's projection bytes (GPU: 16-bit scales; CPU: float32 or torch's packed bf16
    kernels) equal what the loaded QuantLinear layers hold, act-order input orders included."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.quant_config import spec_quant
    from backends.torch_engine.gptq_awq import packed_weights
    from backends.torch_engine.model_runner import ModelRunner
    from backends.torch_engine.quantize import QuantLinear
    from tests.gptq_awq_factory import Variant, write_quantized

    folder, _ = write_quantized(tmp_path / "q", Variant(**variant))
    spec = load_spec(folder)
    shape = spec.to_shape()
    norms = 4 * 2 * shape.hidden_size

    def per_layer(where: str) -> int:
        return m.checkpoint_weights(shape, where).layer_bytes[0] - norms

    # on a GPU the loader keeps the unpacked layout with scales in the 16-bit compute dtype
    from safetensors.torch import load_file

    quant = spec_quant(spec.path, spec.metadata)
    from backends.quant_config import packed_modules

    modules = packed_modules(quant, spec.tensors, spec.path)  # type: ignore[arg-type]
    stream = packed_weights(load_file(str(folder / "model.safetensors")).items(), quant, modules, torch.bfloat16)  # type: ignore[arg-type]
    gpu = {}
    for name, t in stream:
        if ".layers.0." in name and (name.endswith(".weight") or name.endswith(".input_perm")) and "proj" in name:
            gpu[name] = t.nbytes
    perms = {k: v for k, v in gpu.items() if k.endswith(".input_perm")}
    merged_perms = sum(perms.values()) - sum(  # Q/K/V and gate/up share one order once merged
        v for k, v in perms.items() if k.endswith(("k_proj.input_perm", "v_proj.input_perm", "up_proj.input_perm"))
    )
    assert per_layer("gpu") == sum(v for k, v in gpu.items() if k.endswith(".weight")) + merged_perms

    for dtype, where in (("float32", "cpu_fp32"), ("bfloat16", "cpu_bf16")):
        runner = ModelRunner(spec, LoadOptions(n_ctx=32, max_num_seqs=1, dtype=dtype, n_threads=1))
        layer = [x for x in runner.model.layers[0].modules() if isinstance(x, QuantLinear)]
        held = sum(x.nbytes + (x.input_perm.nbytes if x.input_perm is not None else 0) for x in layer)
        if where == "cpu_bf16" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
            continue  # no packed CPU kernels in this torch build
        assert per_layer(where) == held, (dtype, variant)


def test_hearth_plan_json_on_a_gptq_folder(tmp_path: Path) -> None:
    """`hearth plan FOLDER --json` on an RTX 4090: the label is the plan's quant, the only candidate."""
    pytest.importorskip("safetensors")
    from tests.gptq_awq_factory import Variant, write_quantized

    folder, _ = write_quantized(tmp_path / "q", Variant(method="awq"))
    hardware = str(FIXTURES / "rtx4090_24gb.json")
    res = subprocess.run(
        [sys.executable, "-m", "app", "plan", str(folder), "--hardware", hardware, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    p = json.loads(res.stdout)
    assert (p["backend"], p["quant"]) == ("torch", "AWQ-4bit-g32")
    assert {(c["backend"], c["quant"]) for c in p["candidates"]} == {("torch", "AWQ-4bit-g32")}
    assert any("AWQ-4bit-g32" in r for r in p["reasons"])
