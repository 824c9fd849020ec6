"""The planner's speculative decision (hwprobe.speculative): off / prompt lookup / a draft model priced into the
plan's device memory, refused with the numbers when the draft does not fit, never on llama.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest
from hw_shapes import q4_0_llama_spec

from hwprobe import plan
from hwprobe.errors import PlanError
from hwprobe.memory import mib
from hwprobe.plan_types import Prefs
from hwprobe.report import load_report
from hwprobe.speculative import draft_bytes, plan_speculative

FIXTURES = Path(__file__).parent / "fixtures"
TARGET = q4_0_llama_spec("Target-Q4_0", 8, 1024, 2816).to_shape()
DRAFT = q4_0_llama_spec("Draft-Q4_0", 2, 256, 704).to_shape()
HUGE_DRAFT = q4_0_llama_spec("Huge-Q4_0", 80, 8192, 28672).to_shape()


def torch_plan():
    return plan(load_report(FIXTURES / "no_gpu_laptop.json"), TARGET, Prefs(backend="torch"))


def test_off_and_prompt_lookup_cost_no_memory() -> None:
    p = torch_plan()
    assert plan_speculative(p, "off").speculative.method == "off"
    ngram = plan_speculative(p, "ngram")
    assert (ngram.speculative.method, ngram.speculative.k) == ("ngram", 8)
    assert ngram.devices == p.devices
    auto = plan_speculative(p, "auto")  # no local draft: prompt lookup, and the reason says so
    assert auto.speculative.method == "ngram" and "no local draft" in auto.speculative.reason
    assert auto.as_dict()["speculative"]["method"] == "ngram"


def test_a_draft_that_fits_is_priced_into_the_device_it_runs_on() -> None:
    p = torch_plan()
    d = plan_speculative(p, "auto", DRAFT, "draft")
    weights, kv = draft_bytes(DRAFT, p.ctx, p.max_num_seqs)
    assert (d.speculative.method, d.speculative.draft) == ("draft", "draft")
    assert (d.speculative.draft_weights_mib, d.speculative.draft_kv_mib) == (mib(weights), mib(kv))
    cpu_before = next(x for x in p.devices if x.kind == "cpu")
    cpu_after = next(x for x in d.devices if x.kind == "cpu")
    assert cpu_after.weights_mib == cpu_before.weights_mib + mib(weights)
    assert cpu_after.kv_mib == cpu_before.kv_mib + mib(kv)
    assert d.fits


def test_a_draft_that_does_not_fit_falls_back_or_is_refused_with_numbers() -> None:
    p = torch_plan()
    assert plan_speculative(p, "auto", HUGE_DRAFT, "huge").speculative.method == "ngram"
    with pytest.raises(PlanError, match="MiB"):
        plan_speculative(p, "draft", HUGE_DRAFT, "huge")


def test_llama_cpp_plans_never_speculate() -> None:
    p = plan(load_report(FIXTURES / "no_gpu_laptop.json"), TARGET, Prefs(backend="llama.cpp"))
    assert plan_speculative(p, "auto").speculative.method == "off"
    with pytest.raises(PlanError, match="torch"):
        plan_speculative(p, "ngram")
