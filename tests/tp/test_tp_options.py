"""--tensor-parallel N from the command line to LoadOptions: run/chat/serve/ppl/plan/show take it, bench too,
the plan's choice becomes LoadOptions.tensor_parallel, and bad values are one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.loading import decide
from app.settings import Settings, load_settings
from hwprobe.errors import ConfigError

FIXTURES = Path(__file__).parents[1] / "hwprobe" / "fixtures"


def hearth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture()
def starter_spec(starter_path):
    from app.store import ModelStore

    return ModelStore().spec(str(starter_path))[1]


def test_every_loading_command_takes_the_flag() -> None:
    import argparse

    from app.commands import bench, chat, plan, ppl, run, serve

    for command in (run, chat, serve, ppl, bench, plan):
        p = argparse.ArgumentParser()
        command.add_arguments(p)
        args = p.parse_known_args(["--tensor-parallel", "2", "file.txt"])[0]
        assert args.tensor_parallel == 2, command.__name__


def test_the_plan_becomes_load_options(starter_spec) -> None:
    d = decide(starter_spec, Settings(tensor_parallel=2))  # this machine: no GPU, 2 ranks on the CPU cores
    assert (d.backend, d.options.tensor_parallel, d.options.device) == ("torch", 2, "cpu")
    d = decide(starter_spec, Settings(tensor_parallel=2), str(FIXTURES / "2x3090_nvlink.json"))
    assert (d.backend, d.options.tensor_parallel, d.options.device, d.plan.split_mode) == ("torch", 2, "cuda", "tensor")
    # each rank's KV pool is the plan's per-device bytes
    assert d.options.kv_cache_bytes == d.plan.kv_pool_bytes > 0
    d = decide(starter_spec, Settings(), str(FIXTURES / "2x3090_nvlink.json"))  # 135 M fits one card in bf16
    assert d.options.tensor_parallel == 1
    assert decide(starter_spec, Settings(backend="llama.cpp")).options.tensor_parallel == 1


def test_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel must be between 1 and 64 ranks, got 0"):
        load_settings(tensor_parallel=0)
    r = hearth("plan", "--tensor-parallel", "0")
    assert r.returncode == 2 and "tensor_parallel must be between 1 and 64" in r.stderr
    assert "Traceback" not in r.stderr and "hint: one rank per GPU" in r.stderr


def test_plan_json_reports_the_ranks(starter_path) -> None:
    r = hearth(
        "plan",
        str(starter_path),
        "--hardware",
        str(FIXTURES / "2x3090_nvlink.json"),
        "--tensor-parallel",
        "2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["backend"], d["split_mode"], d["tensor_parallel"]) == ("torch", "tensor", 2)
    r = hearth(
        "plan",
        str(starter_path),
        "--hardware",
        str(FIXTURES / "2x3090_nvlink.json"),
        "--backend",
        "llama.cpp",
        "--json",
    )
    assert json.loads(r.stdout)["tensor_parallel"] == 1


def test_cpu_ranks_allocate_the_plans_pool(starter_spec) -> None:
    """The plan is the allocation: each rank's KV pool is its heads' share of the plan's tokens."""
    from backends.torch_engine.parts import kv_pool_blocks

    d = decide(starter_spec, Settings(tensor_parallel=2))
    p = d.plan
    tokens = next(x.kv_pool_tokens for x in p.devices if x.kind == "cpu")
    per_token = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, 2 bytes (bf16 on this CPU)
    assert p.kv_pool_bytes == d.options.kv_cache_bytes == tokens * per_token * 2 // 3  # rank 0: 2 of 3 KV heads
    assert kv_pool_blocks(starter_spec, d.options, 2, n_kv_heads=2) * 16 == tokens  # what every rank allocates
    assert any("ranks share the CPU" in r for r in p.reasons)
