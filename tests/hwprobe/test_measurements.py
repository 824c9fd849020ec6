"""What this machine measured, kept for the planner (app/measurements.py): decode records per GPU, quality records
per model, and how `hearth bench` turns a GPU run into a record the next plan prefers to its table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hw_shapes import llama3_8b_q4_k_m, q4_0_llama_spec

from app.measurements import (
    gpu_key,
    plan_decode_kind,
    quality_records_for,
    record_bench_decode,
    record_decode,
    record_quality,
    with_decode_records,
)
from hwprobe import plan
from hwprobe.bandwidth import GPU_SECONDS_PER_LAYER
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_decode_record_is_the_share_of_the_cards_bandwidth_and_the_next_report_carries_it(tmp_path) -> None:
    report = load_report(FIXTURES / "rtx4090_24gb.json")
    gpu = report.gpus[0]
    path = tmp_path / "m.json"
    rec = record_decode(gpu, "torch", "int4", 100.0, 4.0e9, 32, tokens_per_s_16=900.0, source="bench", path=path)
    want = 4.0e9 / (1008e9 * (1 / 100 - 32 * GPU_SECONDS_PER_LAYER))
    assert rec.share == pytest.approx(want, abs=1e-4) and rec.batch16 == 9.0 and rec.source.startswith("bench (")
    again = record_decode(gpu, "torch", "int4", 120.0, 4.0e9, 32, source="bench", path=path)  # replaces it
    got = with_decode_records(report, path).gpus[0].decode_records
    assert got == (again,)
    record_decode(gpu, "llama.cpp", "ggml", 130.0, 4.6e9, 32, source="bench", path=path)
    assert [r.kind for r in with_decode_records(report, path).gpus[0].decode_records] == ["ggml", "int4"]
    other = dataclasses.replace(gpu, name="NVIDIA GeForce RTX 3090", compute_capability="8.6")
    assert gpu_key(other) != gpu_key(gpu)
    assert with_decode_records(dataclasses.replace(report, gpus=(other,)), path).gpus[0].decode_records == ()
    with pytest.raises(ValueError, match="no kind"):
        record_decode(gpu, "llama.cpp", "int4", 100.0, 4e9, 32, source="x", path=path)


def test_an_unreadable_or_hand_broken_file_counts_as_empty(tmp_path) -> None:
    report = load_report(FIXTURES / "rtx4090_24gb.json")
    path = tmp_path / "m.json"
    path.write_text("{not json")
    assert with_decode_records(report, path) == report and quality_records_for("x", path) == ()
    key = gpu_key(report.gpus[0])
    path.write_text('{"decode": {"%s": [{"engine": "torch", "kind": "int4", "share": 7}]}}' % key)
    assert with_decode_records(report, path) == report  # a share above 1: that GPU's records are not used
    record_quality("m", "W8A16", 0.25, 0.001, "ppl", path)  # rewritten whole, the bad part kept aside
    assert quality_records_for("m", path)[0][:2] == ("W8A16", 0.25)


def test_bench_records_a_whole_gpu_plan_and_nothing_else(tmp_path) -> None:
    report = load_report(FIXTURES / "rtx4090_24gb.json")
    spec = llama3_8b_q4_k_m()
    path = tmp_path / "m.json"
    on_gpu = plan(report, spec.to_shape())  # llama.cpp, every layer on GPU 0
    rec = record_bench_decode(report, spec, on_gpu, 120.0, None, path)
    assert rec is not None and (rec.engine, rec.kind) == ("llama.cpp", "ggml") and 0.5 < rec.share < 1
    assert spec.name in rec.source
    # a mixed GGUF layout (int4 and int8 blocks) has no one kernel's speed to record; one kind has
    torch = plan(report, spec.to_shape(), Prefs(backend="torch", max_ppl_increase_pct=0))
    assert torch.quant == "GGUF" and record_bench_decode(report, spec, torch, 20.0, None, path) is None
    q4_0 = q4_0_llama_spec("Llama-2-7B-Q4_0", 32, 4096, 11008)
    assert plan_decode_kind(q4_0.to_shape(), "torch", "GGUF") == "int4"
    # a plan on the CPU records nothing
    cpu = plan(load_report(FIXTURES / "no_gpu_laptop.json"), q4_0.to_shape())
    assert record_bench_decode(report, q4_0, cpu, 10.0, None, path) is None
