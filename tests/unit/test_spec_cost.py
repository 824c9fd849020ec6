"""Speculation's cost model (backends/torch_engine/speculative/cost.py): measured step costs by token count, the
expected tokens of k proposals, and the k that pays; SpecState's recent acceptance (pure Python)."""

from __future__ import annotations

import pytest

from backends.torch_engine.speculative.cost import UNMEASURED_SLOPE, StepCosts, best_k, expected_tokens
from backends.torch_engine.speculative.proposer import SpecState


def _costs(by_tokens: dict[int, float]) -> StepCosts:
    costs = StepCosts()
    for n, s in by_tokens.items():
        costs.observe(n, s)
    return costs


def test_step_costs_average_measurements_and_price_unmeasured_sizes_optimistically() -> None:
    costs = _costs({1: 10.0, 4: 12.0})
    costs.observe(1, 20.0)  # a moving average: one slow step moves it a fifth of the way
    assert costs.cost(1) == pytest.approx(12.0)
    assert costs.ratio(1, 3) == pytest.approx(1.0)
    assert costs.cost(6) == pytest.approx(12.0 * (1 + 2 * UNMEASURED_SLOPE))  # from 4, the largest below
    assert costs.cost(0) is None and StepCosts().ratio(1, 2) == pytest.approx(1 + 2 * UNMEASURED_SLOPE)


def test_expected_tokens_count_the_accepted_run_and_the_targets_own_token() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_best_k_follows_the_measured_costs_and_declines_when_nothing_pays() -> None:
    # the starter on the 2-core EPYC, roughly: up to 4 tokens ~1.1-1.4x a decode, then 2-3x
    costs = _costs({1: 1.0, 2: 1.1, 3: 1.3, 4: 1.35, 5: 2.2, 6: 2.6, 7: 2.8, 8: 2.9, 9: 3.0})
    assert best_k(0.9, 8, costs, 1)[0] == 3  # 4 tokens cost 1.35: k = 3; past that the rows cost too much
    assert best_k(0.9, 2, costs, 1)[0] == 2  # capped by the request's adaptive k
    assert best_k(0.05, 8, costs, 1) == (0, 1.0)  # 1.05 expected tokens for 1.1x the time: decode plainly
    flat = _costs({n: 1.0 for n in range(1, 10)})  # a GPU-like flat curve: propose all you may
    assert best_k(0.6, 8, flat, 1)[0] == 8


def test_acceptance_follows_recent_verifications_and_fades_back_when_declined() -> None:
    s = SpecState(k=4)
    assert s.acceptance == 0.5
    for _ in range(4):
        s.record(4, 4, k_max=8)
    high = s.acceptance
    assert high > 0.8
    s.record(4, 0, k_max=8)
    assert s.acceptance < high
    low = SpecState(k=1)
    for _ in range(6):
        low.record(1, 0, k_max=8)
    assert low.acceptance < 0.2
    for _ in range(30):
        low.decline()
    assert 0.4 < low.acceptance < 0.5  # the evidence faded: it will try again
