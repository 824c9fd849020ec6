"""The planner's support table follows the engine: every architecture the torch engine builds is in
hwprobe.support (and nothing else is), such a model goes to the torch engine where it fits a GPU, and
`hearth plan`'s reasons say which engine runs it and why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hwprobe import plan
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report
from hwprobe.shape import ModelShape

FIXTURES = Path(__file__).parent / "fixtures"

# shapes from each model's config.json (Gemma 3 1B: 26 layers, 5:1 sliding window of 512; Qwen3-8B;
# Phi-3-mini-4k; Phi-4 14B); the tokenizers are what hwprobe.support checks, not necessarily the files' own
GEMMA3_1B = ModelShape(
    "Gemma-3-1B",
    "gemma3",
    26,
    1152,
    4,
    1,
    256,
    6912,
    262144,
    32768,
    sliding_window=512,
    sliding_window_layers=22,
    tokenizer="llama/default",
)
QWEN3_8B = ModelShape("Qwen3-8B", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, tokenizer="gpt2/qwen2")
PHI3_MINI = ModelShape("Phi-3-mini-4k", "phi3", 32, 3072, 32, 32, 96, 8192, 32064, 4096, tokenizer="llama/default")
PHI4 = ModelShape("Phi-4", "phi3", 40, 5120, 40, 10, 128, 17920, 100352, 16384, tokenizer="gpt2/dbrx")
FALCON = ModelShape("Falcon-7B", "falcon", 32, 4544, 71, 1, 64, 18176, 65024, 2048)


def test_support_table_lists_exactly_the_engines_families() -> None:
    from backends.torch_engine.models import FAMILIES
    from hwprobe.support import TORCH_ENGINE_ARCHITECTURES

    assert sorted(FAMILIES) == sorted(TORCH_ENGINE_ARCHITECTURES)


@pytest.mark.parametrize("shape", [GEMMA3_1B, QWEN3_8B, PHI3_MINI])
def test_dense_architectures_the_engine_runs_race_on_a_gpu(shape: ModelShape) -> None:
    """The torch engine is a candidate wherever it fits; the race decides (today's measured kernels: llama.cpp
    for one stream, the torch engine for serving, where it batches), and the reasons say so."""
    report = load_report(FIXTURES / "rtx4090_24gb.json")
    p = plan(report, shape, Prefs())
    assert any(c.backend == "torch" for c in p.candidates), p.candidates
    assert p.backend == "llama.cpp" and any(f"the torch engine runs {shape.architecture} too" in r for r in p.reasons)
    served = plan(report, shape, Prefs(prefer_batching=True, max_num_seqs=16))
    assert served.backend == "torch", served.reasons
    assert any(f"the torch engine supports {shape.architecture}" in r for r in served.reasons), served.reasons


def test_on_a_cpu_the_reason_names_both_engines() -> None:
    p = plan(load_report(FIXTURES / "no_gpu_laptop.json"), GEMMA3_1B, Prefs())
    assert p.backend == "llama.cpp"
    assert any("faster for one stream" in r and "the torch engine runs gemma3 too" in r for r in p.reasons)


@pytest.mark.parametrize(
    "shape,why",
    [
        (FALCON, "does not implement falcon"),
        (PHI4, "tokenizer"),  # a byte-level BPE pre-tokenizer ("dbrx") the torch engine does not build
    ],
)
def test_what_the_torch_engine_cannot_run_goes_to_llama_cpp_and_says_why(shape: ModelShape, why: str) -> None:
    for fixture in ("rtx4090_24gb", "no_gpu_laptop"):
        p = plan(load_report(FIXTURES / f"{fixture}.json"), shape, Prefs())
        assert p.backend == "llama.cpp"
        assert any(r.startswith("backend llama.cpp: ") and why in r for r in p.reasons), (fixture, p.reasons)


def test_phi4_with_a_tokenizer_it_builds_goes_to_the_torch_engine() -> None:
    phi4 = dataclasses.replace(PHI4, tokenizer="hf")
    p = plan(load_report(FIXTURES / "rtx4090_24gb.json"), phi4, Prefs(prefer_batching=True, max_num_seqs=16))
    assert p.backend == "torch"
