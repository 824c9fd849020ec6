"""plan() against recorded machine profiles x hand-written model shapes, with expectations worked out by hand.

Hand arithmetic used below (GiB = 2**30 bytes):
- Llama-2-7B has 6.74 B parameters: bf16 12.6 GiB, so a 24 GB card (budget ~22.6 GiB after the margin) holds it
  whole with its 4096-token f16 KV cache (2 x 32 layers x 32 heads x 128 x 2 B x 4096 = 2.0 GiB).
- Llama-2-13B (13.0 B): bf16 24.2 GiB does not fit a 4090; W8A16 ~12.4 GiB + 3.1 GiB KV at 4096 does.
- Qwen2.5-14B (14.7 B, 8 KV heads): W8A16 ~15.2 GiB (its 152k vocabulary stays 16-bit, twice) + 1.5 GiB KV at
  8192 fits a 4090.
- Llama-2-70B (69 B) needs ~39 GiB even at Q4_K_M (4.89 bpw): more than one 3090, less than two.
- Mixtral-8x7B (46.7 B, all experts in memory) at Q4_K_M is ~26.6 GiB: some experts in host RAM on one 24 GB card.

What fits whole on the GPUs races by expected speed within the quality budget (hwprobe/race.py; default +1 %
perplexity): for a model given by its config, llama.cpp's Q5_K_M (+0.91 % on Llama-3-8B by llama.cpp's own
scoreboard) at 65-82 % of the card's bandwidth beats everything else within the budget on today's measured
efficiencies; the torch engine's formats are checked with --backend torch, and quality first with budget 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hw_shapes import ALL, LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, MISTRAL_7B, MIXTRAL_8X7B, QWEN25_14B

from hwprobe import plan
from hwprobe.errors import PlanError
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report

FIXTURES = Path(__file__).parent / "fixtures"
EIGHT_BIT_OR_BETTER = {"bf16", "fp16", "F16", "FP8", "W8A16", "Q8_0"}
Q4_K_M_OR_BETTER = EIGHT_BIT_OR_BETTER | {"Q6_K", "Q5_K_M", "Q4_K_M", "W4A16+attn8", "W4A16"}


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def gpu_total_mib(p) -> int:
    return sum(d.total_mib for d in p.devices if d.kind == "gpu")


@pytest.mark.parametrize("fixture", sorted(f.stem for f in FIXTURES.glob("*.json")))
@pytest.mark.parametrize("shape", ALL, ids=lambda s: s.name)
def test_every_plan_fits_its_budgets_or_says_why(fixture: str, shape) -> None:
    try:
        p = plan(hw(fixture), shape)
    except PlanError as exc:
        assert "GiB" in exc.message and exc.hint
        return
    assert all(d.total_mib <= d.budget_mib for d in p.devices), p.devices
    assert 0 <= p.n_gpu_layers <= p.n_layers == shape.n_layers
    assert min(4096, shape.context_length) <= p.ctx <= min(8192, shape.context_length)
    assert p.reasons and p.expected_tokens_per_s > 0
    assert [d.kind for d in p.devices] == ["gpu"] * len(hw(fixture).gpus) + ["cpu"]


@pytest.mark.parametrize("fixture", ["rtx3090_24gb", "rtx4090_24gb"])
@pytest.mark.parametrize("shape", [LLAMA2_7B, LLAMA3_8B, MISTRAL_7B], ids=lambda s: s.name)
def test_24gb_card_runs_a_7b_whole_at_the_fastest_format_within_the_budget(fixture: str, shape) -> None:
    p = plan(hw(fixture), shape)
    assert p.n_gpu_layers == p.n_layers
    assert p.ctx == min(8192, shape.context_length)
    assert (p.backend, p.quant) == ("llama.cpp", "Q5_K_M")
    within = [c for c in p.candidates if c.within_budget]
    assert all(c.ppl_increase_pct <= 1.0 for c in within) and {"Q8_0", "Q6_K", "bf16"} <= {c.quant for c in within}
    assert p.expected_tokens_per_s == max(c.expected_tokens_per_s for c in within)
    # budget 0: the best quality only, the old order (the best weights that fit)
    best = plan(hw(fixture), shape, Prefs(max_ppl_increase_pct=0))
    assert best.quant in EIGHT_BIT_OR_BETTER and all(c.ppl_increase_pct == 0 for c in best.candidates if c.chosen)


def test_llama2_7b_on_a_3090_in_the_torch_engine_is_bf16_whole() -> None:
    p = plan(hw("rtx3090_24gb"), LLAMA2_7B, Prefs(backend="torch"))
    assert (p.backend, p.quant, p.ctx, p.kv_cache_type, p.split_mode) == ("torch", "bf16", 4096, "f16", "none")
    gpu = p.devices[0]
    assert 12_700 < gpu.weights_mib < 13_000  # 6.74 B x 2 B = 12.6 GiB (~12 860 MiB)
    # the KV pool: what the budget leaves, at least one sequence of 2 x 32 x 32 x 128 x 2 B x 4096 = 2048 MiB
    assert gpu.kv_pool_tokens >= 4096 and gpu.kv_mib == gpu.kv_pool_tokens * 2048 // 4096 and gpu.headroom_mib >= 0


@pytest.mark.parametrize("shape,ctx", [(LLAMA2_13B, 4096), (QWEN25_14B, 8192)], ids=lambda v: getattr(v, "name", v))
def test_4090_runs_a_13b_at_q4_k_m_or_better_with_full_context(shape, ctx: int) -> None:
    p = plan(hw("rtx4090_24gb"), shape)
    assert p.quant in Q4_K_M_OR_BETTER
    assert p.n_gpu_layers == p.n_layers
    assert p.ctx == ctx
    # bf16 is > 24 GiB; the torch engine's loader quantizes as it reads, so its int8 weights (~12-14 GiB) fit
    # whole: W8A16 before FP8 (the same bytes, int8 keeps more of the weights; planner._torch_formats).
    torch = plan(hw("rtx4090_24gb"), shape, Prefs(backend="torch"))
    assert (torch.backend, torch.quant) == ("torch", "W8A16")


def test_torch_engine_is_offered_only_what_it_can_load() -> None:
    from hwprobe.support import TORCH_ENGINE_RUNNABLE_FORMATS

    # Half precision when it fits: an 8B in bf16 (~15 GiB) fits a 4090 whole.
    p = plan(hw("rtx4090_24gb"), LLAMA3_8B, Prefs(backend="torch"))
    assert (p.backend, p.quant, p.split_mode) == ("torch", "bf16", "none")
    # Formats its loader produces, on one GPU or in tensor parallelism over P2P-joined ones (never a layer
    # split); W4A16 (nor W4A16+attn8, whose MLP is W4A16) never for a model llama.cpp could run from a GGUF at
    # Q4_K_M or better (config-only shapes).
    for fixture in ("rtx3090_24gb", "rtx4090_24gb", "2x3090_nvlink", "2x4090_no_p2p", "rtx4060_laptop_8gb"):
        for shape in ALL:
            try:
                q = plan(hw(fixture), shape)
            except PlanError:
                continue  # e.g. a 70B on the 8 GB laptop: nothing fits, said with the numbers
            assert q.backend != "torch" or (
                q.quant in TORCH_ENGINE_RUNNABLE_FORMATS
                and q.quant not in ("W4A16", "W4A16+attn8")
                and (
                    len(q.tensor_split) <= 1
                    or q.split_mode == "tensor"
                    and q.tensor_parallel == len(q.tensor_split)
                    and fixture == "2x3090_nvlink"
                )
            ), (fixture, shape)


def test_70b_on_two_nvlinked_3090s_uses_both_cards_tensor_split() -> None:
    p = plan(hw("2x3090_nvlink"), LLAMA2_70B)
    assert all(d.weights_mib > 15_000 for d in p.devices if d.kind == "gpu")
    assert p.split_mode == "tensor"
    assert p.n_gpu_layers == 80
    assert len(p.tensor_split) == 2 and abs(sum(p.tensor_split) - 1) < 0.01


def test_70b_on_two_4090s_without_p2p_splits_by_layer() -> None:
    p = plan(hw("2x4090_no_p2p"), LLAMA2_70B)
    assert p.backend == "llama.cpp" and p.split_mode == "layer"  # the torch engine needs P2P for TP
    assert p.quant == "Q4_K_M" and p.n_gpu_layers == 80
    assert all(d.weights_mib > 15_000 for d in p.devices if d.kind == "gpu")


def test_70b_on_one_3090_offloads_part_to_ram() -> None:
    p = plan(hw("rtx3090_24gb"), LLAMA2_70B)
    assert p.backend == "llama.cpp" and p.quant == "Q4_K_M"
    assert 30 < p.n_gpu_layers < 60  # ~39 GiB of weights, ~22 GiB of budget
    assert p.devices[-1].weights_mib > 15_000


def test_busy_3090_keeps_a_plan_that_fits_only_with_less_headroom() -> None:
    # Llama-2-7B in bf16 (~12.6 GiB + 2 GiB KV) fits both the idle card and the busy one (6 GB held by another
    # program): the same plan, but the busy card's headroom shows the memory the other program holds.
    torch = Prefs(backend="torch")
    idle, busy = plan(hw("rtx3090_24gb"), LLAMA2_7B, torch), plan(hw("rtx3090_busy"), LLAMA2_7B, torch)
    assert (idle.backend, idle.quant) == (busy.backend, busy.quant) == ("torch", "bf16")
    assert gpu_total_mib(busy) <= busy.devices[0].budget_mib
    # the torch engine's KV pool takes what the budget leaves, so the busy card's pool is the smaller
    assert busy.devices[0].kv_mib < idle.devices[0].kv_mib - 6000
    assert busy.devices[0].kv_pool_tokens >= 4096 and busy.devices[0].headroom_mib >= 0


@pytest.mark.parametrize(
    "shape,prefs",
    # an 8B's fastest format fits either card whole: in the torch engine, bf16 fits only the idle one
    [(LLAMA2_70B, Prefs()), (LLAMA3_8B, Prefs(backend="torch")), (MIXTRAL_8X7B, Prefs())],
    ids=lambda v: getattr(v, "name", ""),
)
def test_busy_3090_gets_a_smaller_plan_than_the_idle_one(shape, prefs) -> None:
    idle, busy = plan(hw("rtx3090_24gb"), shape, prefs), plan(hw("rtx3090_busy"), shape, prefs)
    assert busy.devices[0].budget_mib < idle.devices[0].budget_mib - 6000
    assert gpu_total_mib(busy) <= busy.devices[0].budget_mib
    assert (
        busy.n_gpu_layers < idle.n_gpu_layers
        or busy.cpu_expert_layers > idle.cpu_expert_layers
        or busy.ctx < idle.ctx
        or busy.quant != idle.quant
    )


def test_busy_3090_plan_names_the_memory_other_programs_hold() -> None:
    p = plan(hw("rtx3090_busy"), LLAMA2_7B)
    assert any("held by other programs" in r for r in p.reasons)


def test_mixtral_counts_all_experts_and_offloads_on_one_card() -> None:
    """Every layer's attention and KV on the card, the experts of a few layers in host RAM (test_planner_moe)."""
    p = plan(hw("rtx3090_24gb"), MIXTRAL_8X7B)
    assert p.backend == "llama.cpp" and p.quant == "Q4_K_M" and p.n_gpu_layers == 32
    assert 1 <= p.cpu_expert_layers <= 12
    weights_gib = sum(d.weights_mib for d in p.devices) / 1024
    assert 25 < weights_gib < 28  # 46.7 B x 4.89 bits = 26.6 GiB: every expert counted
    assert any("experts" in r for r in p.reasons)


def test_no_gpu_laptop_runs_7b_on_cpu_at_the_best_quant_that_fits_ram() -> None:
    p = plan(hw("no_gpu_laptop"), LLAMA2_7B)
    # F16 13.5 GB > 10.7 GiB of RAM budget (12000 MiB available - 1 GiB margin); Q8_0 7.2 GB fits.
    assert (p.backend, p.quant, p.n_gpu_layers, p.split_mode) == ("llama.cpp", "Q8_0", 0, "none")


def test_nothing_fits_is_a_plan_error_with_numbers() -> None:
    with pytest.raises(PlanError, match=r"needs \d+\.\d GiB in host RAM"):
        plan(hw("no_gpu_laptop"), LLAMA2_70B)


def test_small_card_lowers_quant_before_offloading() -> None:
    p = plan(hw("rtx3060_12gb"), QWEN25_14B, Prefs(backend="llama.cpp"))
    assert p.n_gpu_layers == p.n_layers and p.quant in ("Q5_K_M", "Q4_K_M")
    assert 4096 <= p.ctx < 8192  # the context came down before the quant


def test_kv_quantized_before_the_next_quant_when_context_is_fixed() -> None:
    # Llama-2-13B on a 12 GB 3060 (budget 11288 MiB), 4096 tokens fixed, llama.cpp:
    #   Q6_K weights ~10 040 MiB on the GPU + even a q4_0 KV (900 MiB) + 450 overhead > budget;
    #   Q5_K_M 8733 MiB + f16 KV 3200 MiB > budget, but + q8_0 KV 1700 MiB + 450 + compute 83 = 10 966 fits.
    p = plan(hw("rtx3060_12gb"), LLAMA2_13B, Prefs(backend="llama.cpp", ctx=4096))
    assert (p.quant, p.kv_cache_type, p.ctx, p.n_gpu_layers) == ("Q5_K_M", "q8_0", 4096, 40)
    assert p.devices[0].kv_mib == 1700  # 2 x 40 x 5120 x 34/32 B x 4096


def test_quant_below_q4_k_m_only_when_asked_and_with_a_warning() -> None:
    for fixture in ("rtx4060_laptop_8gb", "rtx3060_12gb"):
        for shape in ALL:
            try:
                assert plan(hw(fixture), shape).quant not in ("Q3_K_M", "Q2_K")
            except PlanError:
                pass
    p = plan(hw("rtx4060_laptop_8gb"), LLAMA2_13B, Prefs(backend="llama.cpp", quant="Q3_K_M"))
    assert p.quant == "Q3_K_M"
    assert any(r.startswith("warning: Q3_K_M is below Q4_K_M") for r in p.reasons)


def test_user_flags_are_taken_as_given() -> None:
    p = plan(hw("rtx3090_24gb"), MISTRAL_7B, Prefs(backend="llama.cpp", ctx=16384, kv_cache_type="q8_0"))
    assert (p.backend, p.ctx, p.kv_cache_type) == ("llama.cpp", 16384, "q8_0")
    p = plan(hw("rtx3090_24gb"), LLAMA2_70B, Prefs(n_gpu_layers=70))
    assert p.n_gpu_layers == 70
    assert any("over its budget" in r for r in p.reasons)  # the user's choice, flagged, not silently changed


def test_json_keys_are_the_issues() -> None:
    d = plan(hw("2x3090_nvlink"), LLAMA2_70B).as_dict()
    for key in (
        "backend",
        "quant",
        "n_gpu_layers",
        "n_layers",
        "split_mode",
        "tensor_split",
        "ctx",
        "kv_cache_type",
        "devices",
        "expected_tokens_per_s",
        "reasons",
    ):
        assert key in d
    assert d["split_mode"] in ("none", "layer", "row", "tensor")
    assert [dev["kind"] for dev in d["devices"]] == ["gpu", "gpu", "cpu"]
    for dev in d["devices"]:
        assert dev["total_mib"] == dev["weights_mib"] + dev["kv_mib"] + dev["compute_mib"] + dev["overhead_mib"]
        assert {"budget_mib", "headroom_mib"} <= set(dev)


def test_more_bandwidth_means_faster_decode() -> None:
    assert (
        plan(hw("rtx4090_24gb"), LLAMA2_7B).expected_tokens_per_s
        > plan(hw("rtx3060_12gb"), LLAMA2_7B).expected_tokens_per_s
        > plan(hw("no_gpu_laptop"), LLAMA2_7B).expected_tokens_per_s
    )


def test_a_gguf_is_never_recut_below_its_own_bits_by_the_torch_engine() -> None:
    from dataclasses import replace

    params = LLAMA2_7B.estimated_param_count
    gguf = replace(LLAMA2_7B, quant="Q4_K_M", weight_bytes=int(params * 4.89 / 8), param_count=params)
    # The torch engine would need bf16 (~13 GiB > the 8 GB laptop's budget); llama.cpp runs the file whole
    # at its own Q4_K_M rather than anything cut lower.
    p = plan(hw("rtx4060_laptop_8gb"), gguf)
    assert (p.backend, p.quant, p.n_gpu_layers) == ("llama.cpp", "Q4_K_M", 32)


@pytest.mark.parametrize(
    "prefs,match",
    [
        (Prefs(backend="vllm"), "backend"),
        (Prefs(quant="Q9"), "unknown quant"),
        (Prefs(kv_cache_type="q2"), "KV cache"),
        (Prefs(ctx=8), "at least 16"),
    ],
)
def test_bad_preferences_are_config_errors(prefs: Prefs, match: str) -> None:
    from hwprobe.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        plan(hw("rtx3090_24gb"), LLAMA2_7B, prefs)


def test_models_the_torch_engine_cannot_run_go_to_llama_cpp_even_when_they_fit() -> None:
    import dataclasses

    from hwprobe.support import torch_engine_refusal

    odd = dataclasses.replace(LLAMA2_7B, tokenizer="gpt2/deepseek-coder")  # a BPE pre-tokenizer hearth lacks
    p = plan(hw("rtx3090_24gb"), odd, Prefs())
    assert p.backend == "llama.cpp" and p.n_gpu_layers == p.n_layers
    assert any("tokenizer" in r for r in p.reasons)
    assert torch_engine_refusal(dataclasses.replace(LLAMA2_7B, tokenizer="gpt2/smollm")) is None
    assert torch_engine_refusal(dataclasses.replace(LLAMA2_7B, tokenizer="llama/default")) is None  # SentencePiece
    assert "experts" in torch_engine_refusal(
        MIXTRAL_8X7B.__class__(**{**MIXTRAL_8X7B.__dict__, "architecture": "llama"})
    )


def test_torch_tokenizer_list_matches_the_engine() -> None:
    from backends.torch_engine.tokenizer import _PRE
    from hwprobe.support import TORCH_ENGINE_GGUF_PRE_TOKENIZERS

    assert set(_PRE) == set(TORCH_ENGINE_GGUF_PRE_TOKENIZERS)
