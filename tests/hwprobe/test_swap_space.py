"""Plan = allocation for the torch engine's swap space (issue 27 item 3): on one GPU the plan reserves pinned
host RAM for preempted requests' KV blocks, prices it in host RAM, explains it, and hands the engine exactly
those bytes in whole blocks; without a GPU (or with llama.cpp) it reserves nothing."""

from __future__ import annotations

from pathlib import Path

from hw_shapes import LLAMA3_8B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report
from hwprobe.swap_space import TORCH_SWAP_MAX_BYTES, swap_space_bytes
from tests.hwprobe.test_kv_pool import STARTER

FIXTURES = Path(__file__).parent / "fixtures"
BLOCK = m.TORCH_KV_BLOCK_TOKENS * m.kv_bytes_per_token(LLAMA3_8B, "f16")


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def _host(p):
    return next(d for d in p.devices if d.kind == "cpu")


def test_a_gpu_plan_prices_the_swap_space_in_host_ram_and_explains_it() -> None:
    p = plan(hw("rtx4090_24gb"), LLAMA3_8B, Prefs(backend="torch"))
    assert p.device == "cuda:0" and p.kv_pool_bytes > 0
    assert 0 < p.swap_space_bytes <= min(p.kv_pool_bytes, TORCH_SWAP_MAX_BYTES)
    assert p.swap_space_bytes % BLOCK == 0  # whole blocks: what the engine pins is exactly this
    host = _host(p)
    assert host.swap_mib == m.mib(p.swap_space_bytes) and host.headroom_mib >= 0 and p.fits
    assert p.as_dict()["swap_space_bytes"] == p.swap_space_bytes
    assert any(r.startswith(f"swap space: {host.swap_mib} MiB of pinned host RAM") for r in p.reasons)


def test_the_swap_space_is_capped_by_the_pool_4_gib_and_a_quarter_of_the_host_headroom() -> None:
    assert swap_space_bytes(LLAMA3_8B, "f16", 100 * BLOCK, 1 << 40) == 100 * BLOCK  # the pool
    assert swap_space_bytes(LLAMA3_8B, "f16", 1 << 40, 1 << 40) == TORCH_SWAP_MAX_BYTES  # 4 GiB
    assert swap_space_bytes(LLAMA3_8B, "f16", 1 << 40, 40 * BLOCK + 3) == 10 * BLOCK  # a quarter of the headroom
    assert swap_space_bytes(LLAMA3_8B, "f16", 1 << 40, 3 * BLOCK) == 0  # not one block: none
    assert swap_space_bytes(LLAMA3_8B, "f16", 1 << 40, -5) == 0


def test_no_gpu_and_llama_cpp_plans_reserve_no_swap_space() -> None:
    cpu = plan(hw("no_gpu_laptop"), STARTER, Prefs(backend="torch"))
    assert cpu.device == "cpu" and cpu.swap_space_bytes == 0 and _host(cpu).swap_mib == 0
    assert not any(r.startswith("swap space") for r in cpu.reasons)
    llama = plan(hw("rtx4090_24gb"), LLAMA3_8B, Prefs(backend="llama.cpp"))
    assert llama.swap_space_bytes == 0 and all(d.swap_mib == 0 for d in llama.devices)


def test_decide_hands_the_swap_space_to_the_engine() -> None:
    from app.loading import decide
    from app.settings import Settings
    from tests.hwprobe.test_kv_pool import _llama3_8b_safetensors_spec

    d = decide(_llama3_8b_safetensors_spec(), Settings(backend="torch"), str(FIXTURES / "rtx4090_24gb.json"))
    assert d.options.swap_space_bytes == d.plan.swap_space_bytes > 0
