"""The planner and tensor parallelism (issue 19): two NVLink-joined 3090s (a recorded probe) run a 13B in bf16
across both cards in the torch engine rather than W8A16 on one; cards without P2P, or a model only llama.cpp's
ladder fits, keep llama.cpp's split; --tensor-parallel N is taken as given or refused with the numbers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_13B, LLAMA2_70B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.errors import ConfigError, PlanError
from hwprobe.plan_types import Prefs
from hwprobe.render import plan_text
from hwprobe.report import load_report
from hwprobe.shape import ModelShape
from hwprobe.tensor_parallel import tp_kv_heads, tp_ranks_ok

FIXTURES = Path(__file__).parent / "fixtures"
# the starter's shape: 9 query heads over 3 KV heads
STARTER = ModelShape("SmolLM2-135M", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192)


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def test_a_13b_in_bf16_spans_two_nvlinked_3090s_instead_of_w8a16_on_one() -> None:
    # the torch engine's own choice (for one stream llama.cpp's Q5_K_M is faster today: the engine race)
    torch = Prefs(backend="torch")
    p = plan(hw("2x3090_nvlink"), LLAMA2_13B, torch)
    assert (p.backend, p.quant, p.split_mode, p.tensor_parallel, p.device) == ("torch", "bf16", "tensor", 2, "cuda")
    assert p.as_dict()["tensor_parallel"] == 2 and "tensor_parallel=2" in plan_text(p, "13B")
    gpus = [d for d in p.devices if d.kind == "gpu"]
    assert all(d.total_mib <= d.budget_mib for d in p.devices)
    # each card holds half of the weights and its half of the KV heads of one shared pool of tokens
    assert all(11_000 < d.weights_mib < 13_000 for d in gpus)
    assert gpus[0].kv_pool_tokens == gpus[1].kv_pool_tokens >= 4096 and gpus[0].kv_mib == gpus[1].kv_mib
    per_device = p.kv_pool_bytes  # what LoadOptions.kv_cache_bytes gives each rank
    assert per_device == gpus[0].kv_pool_tokens * m.kv_bytes_per_token(LLAMA2_13B, "f16") // 2
    race = next(r for r in p.reasons if r.startswith("tensor parallel:"))
    assert "2 ranks" in race and "llama.cpp's tensor split would run" in race and race.count("tokens/s") == 2
    # the same model on one 3090: W8A16 (its bf16 does not fit one card), no ranks
    one = plan(hw("rtx3090_24gb"), LLAMA2_13B, torch)
    assert (one.backend, one.quant, one.tensor_parallel, one.split_mode) == ("torch", "W8A16", 1, "none")


def test_no_p2p_or_tensor_parallel_1_keeps_one_card() -> None:
    p = plan(hw("2x4090_no_p2p"), LLAMA2_13B, Prefs(backend="torch"))  # no NVLink/P2P: the engine runs on one card
    assert (p.backend, p.quant, p.tensor_parallel) == ("torch", "W8A16", 1)
    p = plan(hw("2x3090_nvlink"), LLAMA2_13B, Prefs(backend="torch", tensor_parallel=1))
    assert (p.backend, p.quant, p.tensor_parallel, p.split_mode) == ("torch", "W8A16", 1, "none")


def test_llama_cpp_plans_report_one_rank_and_keep_their_split() -> None:
    p = plan(hw("2x3090_nvlink"), LLAMA2_70B)  # no torch format fits 48 GB: llama.cpp Q4_K_M, tensor split
    assert (p.backend, p.split_mode, p.tensor_parallel) == ("llama.cpp", "tensor", 1)
    assert p.as_dict()["tensor_parallel"] == 1 and "tensor_parallel=" not in plan_text(p, "70B")


def test_tensor_parallel_asked_for() -> None:
    p = plan(hw("2x3090_nvlink"), STARTER, Prefs(tensor_parallel=2))
    assert (p.backend, p.tensor_parallel, p.split_mode) == ("torch", 2, "tensor")
    cpu = plan(hw("no_gpu_laptop"), STARTER, Prefs(tensor_parallel=2))  # ranks share the CPU's cores
    assert (cpu.backend, cpu.tensor_parallel, cpu.device) == ("torch", 2, "cpu")
    with pytest.raises(PlanError, match="--tensor-parallel 3 needs 3 GPUs with free memory, this machine has 2"):
        plan(hw("2x3090_nvlink"), STARTER, Prefs(tensor_parallel=3))
    with pytest.raises(ConfigError, match="llama.cpp splits across GPUs by itself"):
        plan(hw("2x3090_nvlink"), STARTER, Prefs(backend="llama.cpp", tensor_parallel=2))
    odd = dataclasses.replace(LLAMA2_13B, n_heads=40, n_kv_heads=2)
    with pytest.raises(PlanError, match="3 tensor-parallel ranks cannot share"):
        plan(load_report(FIXTURES / "2x3090_nvlink.json"), odd, Prefs(tensor_parallel=3))


def test_the_head_rule_matches_the_engines() -> None:
    from backends.torch_engine.tp.partition import head_shards

    for heads, kv in ((9, 3), (32, 8), (64, 8), (8, 1), (40, 40), (28, 4), (12, 2)):
        for world in range(1, 9):
            ok = tp_ranks_ok(heads, kv, world)
            try:
                shards = head_shards(heads, kv, world)
            except Exception:  # noqa: BLE001 - the engine's ConfigError
                assert not ok, (heads, kv, world)
                continue
            assert ok and tp_kv_heads(heads, kv, world) == [s.num_kv_heads for s in shards], (heads, kv, world)


def test_experts_are_not_split_yet() -> None:
    from hw_shapes import MIXTRAL_8X7B

    p = plan(hw("2x3090_nvlink"), MIXTRAL_8X7B)
    assert p.tensor_parallel == 1
    with pytest.raises(PlanError, match="does not split Mixtral-8x7B's 8 experts"):
        plan(hw("2x3090_nvlink"), MIXTRAL_8X7B, Prefs(tensor_parallel=2))
