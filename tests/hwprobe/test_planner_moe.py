"""Expert placement for mixture-of-experts models (hwprobe.experts, issue 18 item 3), against recorded machines.

Hand arithmetic (Mixtral-8x7B, Q4_K_M = 4.89 bits a weight): one block's routed experts are 3 x 4096 x 14336 x 8
= 1.41 B weights = 0.80 GiB; the rest of a block (attention 41.9 M weights, router, norms) 26 MiB.  On a 24 GB
card (budget ~22.7 GiB) the 26.6 GiB model is ~4 GiB over, so about 6-7 blocks' experts go to host RAM, and a
token reads 2 of 8 experts of each: ~0.2 GiB a block from host RAM.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hw_shapes import LLAMA3_8B, MIXTRAL_8X7B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.decode_speed import efficiency
from hwprobe.experts import expert_layer_bytes, expert_tokens_per_s
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report
from hwprobe.shape import ModelShape

FIXTURES = Path(__file__).parent / "fixtures"
# Qwen3-30B-A3B's config.json: 128 experts of width 768, 8 used, no shared expert
QWEN3_30B_A3B = ModelShape(
    "Qwen3-30B-A3B", "qwen3moe", 48, 2048, 32, 4, 128, 768, 151936, 40960, n_experts=128, n_experts_used=8
)
QWEN2_57B_A14B = ModelShape(
    "Qwen2-57B-A14B",
    "qwen2moe",
    28,
    3584,
    28,
    4,
    128,
    2560,
    151936,
    32768,
    n_experts=64,
    n_experts_used=8,
    shared_ffn_size=20480,
)


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def _race(p) -> tuple[float, float]:
    """(expert placement, layer offload) tokens/s from the plan's race sentence."""
    line = next(r for r in p.reasons if r.startswith("MoE placement:"))
    a, b = re.findall(r"~([\d.]+) tokens/s", line)
    return float(a), float(b)


@pytest.mark.parametrize("fixture", ["rtx4090_24gb", "rtx3090_24gb"])
def test_mixtral_on_a_24gb_card_keeps_every_layer_and_moves_experts(fixture: str) -> None:
    p = plan(hw(fixture), MIXTRAL_8X7B)
    assert p.backend == "llama.cpp" and p.n_gpu_layers == p.n_layers == 32
    assert 5 <= p.cpu_expert_layers <= 9
    assert p.as_dict()["cpu_expert_layers"] == p.cpu_expert_layers
    gpu, ram = p.devices
    assert gpu.headroom_mib >= 0 and ram.headroom_mib >= 0
    # host RAM holds those blocks' experts (0.80 GiB each) and no KV: every layer's cache is on the GPU
    assert ram.weights_mib / 1024 == pytest.approx(0.80 * p.cpu_expert_layers, rel=0.05)
    assert ram.kv_mib == 0 and gpu.kv_mib > 0
    experts, layers = _race(p)
    assert p.expected_tokens_per_s == experts > layers
    assert experts > 8.7  # the layer-offload estimate to beat


def test_expert_placement_beats_the_layer_offload_plan_asked_for_by_hand() -> None:
    """The race's layer-offload number is what `--n-gpu-layers` of that many layers plans."""
    p = plan(hw("rtx4090_24gb"), MIXTRAL_8X7B)
    _, layers = _race(p)
    n = int(re.search(r"plain layer offload \((\d+) of", next(r for r in p.reasons if "MoE placement" in r))[1])
    by_hand = plan(hw("rtx4090_24gb"), MIXTRAL_8X7B, Prefs(n_gpu_layers=n))
    assert by_hand.cpu_expert_layers == 0 and by_hand.expected_tokens_per_s == layers


def test_a_model_that_fits_whole_moves_no_experts() -> None:
    p = plan(hw("rtx4090_24gb"), QWEN3_30B_A3B)
    assert p.n_gpu_layers == p.n_layers and p.cpu_expert_layers == 0
    assert not any(r.startswith("MoE placement") for r in p.reasons)
    dense = plan(hw("rtx4090_24gb"), LLAMA3_8B)
    assert dense.as_dict()["cpu_expert_layers"] == 0


@pytest.mark.parametrize("fixture", ["rtx4090_24gb", "rtx3090_24gb"])
def test_qwen3_30b_a3b_at_q8_0_puts_the_overflow_experts_in_ram(fixture: str) -> None:
    """128 experts of which 8 are read: experts are 97 % of a block, so moving them gains much over moving
    whole layers (the race's two numbers differ by far more than for Mixtral)."""
    p = plan(hw(fixture), QWEN3_30B_A3B, Prefs(quant="Q8_0"))
    assert p.quant == "Q8_0" and p.n_gpu_layers == 48 and 0 < p.cpu_expert_layers < 48
    experts, layers = _race(p)
    assert experts > 1.3 * layers
    assert all(d.headroom_mib >= 0 for d in p.devices)


def test_the_fewest_expert_layers_that_fit() -> None:
    """One layer fewer in host RAM would not fit the GPU (the planner bisects to the boundary)."""
    from hwprobe.placement import Candidate, price

    report = hw("rtx4090_24gb")
    p = plan(report, MIXTRAL_8X7B)
    layout = m.weights(MIXTRAL_8X7B, "Q4_K_M")
    fewer = Candidate(
        "llama.cpp", "Q4_K_M", layout, p.ctx, "f16", True, (0,), "none", 32, cpu_expert_layers=p.cpu_expert_layers - 1
    )
    assert price(report, MIXTRAL_8X7B, fewer)[0].headroom_mib < 0


def test_shared_experts_stay_on_the_gpu_and_count_as_read_every_token() -> None:
    """Qwen2-MoE's shared expert (20480 wide) is dense: not part of what may move, always read."""
    share = m.routed_expert_share(QWEN2_57B_A14B)
    without_shared = dataclasses.replace(QWEN2_57B_A14B, shared_ffn_size=0)
    assert share < m.routed_expert_share(without_shared)
    layout = m.weights(QWEN2_57B_A14B, "Q4_K_M")
    routed = expert_layer_bytes(QWEN2_57B_A14B, layout)
    shared_bytes = 3 * 3584 * 20480 * 4.89 / 8
    assert layout.layer_bytes[0] - routed[0] > shared_bytes
    read = m.decode_bytes_per_token(layout, QWEN2_57B_A14B) - layout.head_bytes
    assert read == pytest.approx(sum(layout.layer_bytes) - sum(routed) * (1 - 8 / 64), rel=1e-6)


def test_file_expert_bytes_are_used_when_the_layout_is_the_files() -> None:
    shape = dataclasses.replace(
        MIXTRAL_8X7B,
        layer_bytes=(1000,) * 32,
        expert_bytes=(900,) * 32,
        weight_bytes=40000,
        embedding_bytes=3000,
        output_bytes=3000,
        quant="Q4_K_M",
    )
    assert expert_layer_bytes(shape, m.weights(shape)) == (900,) * 32
    assert expert_layer_bytes(shape, m.weights(shape, "Q8_0")) != (900,) * 32  # another quant: by share


def test_expert_estimate_by_hand() -> None:
    """Two layers, half of each block experts (1 GB), 1 of 4 used, 1 layer's experts on a 100 GB/s host."""
    shape = ModelShape(
        "toy",
        "llama",
        2,
        64,
        1,
        1,
        64,
        64,
        10,
        4096,
        n_experts=4,
        n_experts_used=1,
        layer_bytes=(2 * 10**9, 2 * 10**9),
        expert_bytes=(10**9, 10**9),
        weight_bytes=4 * 10**9,
        embedding_bytes=0,
        output_bytes=0,
        quant="F16",
    )
    report = dataclasses.replace(hw("rtx4090_24gb"), ram_bandwidth_gbps=100.0)
    layout = dataclasses.replace(m.weights(shape), head_bytes=0, other_bytes=0)
    tps = expert_tokens_per_s(report, shape, layout, 0, 1, kv_bytes=0)
    # the RTX 4090 (sm_89, 1008 GB/s) reaches llama.cpp's measured share of its bandwidth (~0.65: the table's
    # Ada row, hwprobe.decode_speed), not a share assumed for every card
    share = efficiency("llama.cpp", "ggml", (8, 9)).share
    gpu = (2e9 + 0.25e9) / (1008e9 * share) + 2 * 20e-6
    cpu = 0.25e9 / (100e9 * 0.6) + 20e-6
    assert tps == pytest.approx(1 / (gpu + cpu), abs=0.05)


@pytest.mark.parametrize(
    "model,fixture,quant",
    [
        ("Mixtral-8x7B", "rtx4090_24gb", None),
        ("Mixtral-8x7B", "rtx3090_24gb", None),
        ("Qwen3-30B-A3B", "rtx4090_24gb", None),
        ("Qwen3-30B-A3B", "rtx3090_24gb", None),
        ("Qwen3-30B-A3B", "rtx4090_24gb", "Q8_0"),
        ("Qwen3-30B-A3B", "rtx3090_24gb", "Q8_0"),
    ],
)
def test_readme_moe_plans_are_what_the_planner_says(model: str, fixture: str, quant: str | None) -> None:
    """docs/moe-plans.md's table of MoE plans comes from `hearth plan examples/moe/*/config.json --hardware ...`."""
    from app.commands.plan import _config_shape

    root = Path(__file__).resolve().parents[2]
    shape = _config_shape(root / "examples" / "moe" / model / "config.json")
    p = plan(hw(fixture), shape, Prefs(quant=quant))
    gpu = {"rtx4090_24gb": "RTX 4090", "rtx3090_24gb": "RTX 3090"}[fixture]
    label = model.replace("-8x7B", " 8x7B")
    rows = [
        r
        for r in (root / "docs" / "moe-plans.md").read_text().splitlines()
        if r.startswith(f"| {label} (") and f"| {gpu} |" in r and ((quant or "") in r if quant else "--quant" not in r)
    ]
    assert len(rows) == 1, rows
    row = rows[0]
    if p.cpu_expert_layers:
        experts, layers = _race(p)
        assert f"experts of {p.cpu_expert_layers} in RAM" in row and f"~{experts:.1f} tok/s" in row
        assert f"~{layers:.1f}" in row
    else:
        assert "fits whole" in row and f"~{p.expected_tokens_per_s:.0f} tok/s" in row
