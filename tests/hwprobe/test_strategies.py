"""The planner as a table (hwprobe/strategies.py, issue 41 item 5): plan() runs STRATEGIES in order, and step 1
races what the RACERS rows propose, so a row added or taken away is all an engine needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hw_shapes import llama3_8b_q4_k_m

from hwprobe import plan, strategies
from hwprobe.report import load_report

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_table_in_order() -> None:
    assert [row.name.split(":")[0].split(" (")[0] for row in strategies.STRATEGIES] == [
        "whole on the GPUs",
        "the torch engine alone",
        "partial offload and the CPU",
    ]
    assert [row.name.split(" ")[0] for row in strategies.RACERS] == ["the", "llama.cpp's"]


def test_plan_races_what_the_rows_propose(monkeypatch: pytest.MonkeyPatch) -> None:
    report, shape = load_report(FIXTURES / "rtx4090_24gb.json"), llama3_8b_q4_k_m().to_shape()
    assert plan(report, shape).backend == "llama.cpp"  # today's kernels: llama.cpp for one stream
    monkeypatch.setattr(strategies, "RACERS", strategies.RACERS[:1])  # the torch engine's row alone
    p = plan(report, shape)
    assert p.backend == "torch" and {c.backend for c in p.candidates} == {"torch"}


def test_a_row_that_finds_nothing_hands_over_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    report, shape = load_report(FIXTURES / "rtx4090_24gb.json"), llama3_8b_q4_k_m().to_shape()
    monkeypatch.setattr(strategies, "RACERS", ())  # nothing races whole on the GPUs: the offload step plans
    p = plan(report, shape)
    assert p.backend == "llama.cpp" and p.candidates and all(c.chosen for c in p.candidates)
