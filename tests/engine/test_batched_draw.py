"""The batched draw (backends/torch_engine/draw.py) against the row-by-row reference, row independence, the
counter-based noise, and the op count that does not grow with the batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from backends.api import SamplingParams
from backends.torch_engine.draw import Scratch, draw, draw_index, filtered_probs, kept_probs, noise_key, uniforms
from backends.torch_engine.penalties import REPEAT_LAST_N, apply_repetition_penalty
from backends.torch_engine.sampler import Sampler
from tests.engine.sampling_reference import reference_probs, reference_token

VOCAB = 1024  # a multiple of 64, like every real vocabulary


def mixed_params(n: int) -> list[SamplingParams]:
    """n rows cycling through every path: the whole vocabulary, top-k groups, top-p with and without top-k,
    min-p, temperatures from sharp to flat, and greedy rows."""
    grid = itertools.cycle(
        [
            dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),  # OpenAI's defaults: no truncation
            dict(temperature=0.8),  # hearth's defaults: top-k 40, top-p 0.95, min-p 0.05
            dict(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0),
            dict(temperature=0.3, top_k=0, top_p=0.9, min_p=0.0),
            dict(temperature=1.0, top_k=0, top_p=0.99, min_p=0.0),
            dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
            dict(temperature=0.7, top_k=VOCAB + 5, top_p=0.5, min_p=0.01),  # top-k past the vocabulary = off
            dict(temperature=0.0),
            dict(temperature=1.2, top_k=1),
        ]
    )
    return [SamplingParams(**next(grid)) for _ in range(n)]


def random_logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def batched(logits: torch.Tensor, params: list[SamplingParams], u: torch.Tensor) -> list[int]:
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    tokens = logits.argmax(dim=-1)
    tokens[sampled] = draw(logits[sampled], [params[i] for i in sampled], u[sampled], Scratch())
    return tokens.tolist()


@pytest.mark.parametrize("scale", [3.0, 0.05])  # peaked rows, and flat ones whose nuclei span most of the vocab
def test_the_batched_draw_picks_the_reference_token_row_by_row(scale: float) -> None:
    params = mixed_params(18)
    for trial in range(6):
        logits = random_logits(len(params), 10 * trial + int(scale * 100), scale)
        u = torch.rand(len(params), generator=torch.Generator().manual_seed(trial))
        got = batched(logits, params, u)
        want = [reference_token(logits[i].double().tolist(), p, float(u[i])) for i, p in enumerate(params)]
        assert got == want


def test_the_one_row_draw_of_the_verifier_and_the_draft_is_the_samplers_draw() -> None:
    """draw.draw_index (the speculative verifier's residual and target draws, the draft's proposals) is the same
    inverse-CDF search as the sampler's rows: over a row's kept distribution it picks the reference token, never a
    token of weight 0 (u at the ends included), and all-zero weights give the largest weight's index."""
    params = [p for p in mixed_params(18) if not p.greedy]
    logits = random_logits(len(params), 21, scale=1.0)
    probs = kept_probs(logits, params)
    g = torch.Generator().manual_seed(4)
    for i, p in enumerate(params):
        for u in [0.0, 1.0 - 2**-53, *torch.rand(8, generator=g).tolist()]:
            token = draw_index(probs[i], u)
            assert probs[i, token] > 0
            assert token == reference_token(logits[i].double().tolist(), p, u), (p, u)
    assert draw_index(torch.zeros(VOCAB), 0.5) == 0


def test_the_filtered_distribution_is_the_reference_one() -> None:
    params = [p for p in mixed_params(9) if not p.greedy]
    logits = random_logits(len(params), 3)
    probs = filtered_probs(logits, params)
    for i, p in enumerate(params):
        want = torch.tensor(reference_probs(logits[i].double().tolist(), p), dtype=torch.float32)
        assert torch.allclose(probs[i], want, atol=1e-6), p


@pytest.mark.parametrize("scale", [3.0, 0.05])
def test_kept_probs_is_the_filtered_distribution_without_the_sort(scale: float) -> None:
    """The speculative paths' whole-row distributions (draw.kept_probs: top-k rows through topk) equal the
    sorted reference, row by row, for every kind of row, in one mixed batch."""
    params = [p for p in mixed_params(18) if not p.greedy]
    logits = random_logits(len(params), 11, scale)
    got = kept_probs(logits, params)
    assert torch.allclose(got, filtered_probs(logits, params), atol=1e-6)
    for i, p in enumerate(params):
        want = torch.tensor(reference_probs(logits[i].double().tolist(), p), dtype=torch.float32)
        assert torch.allclose(got[i], want, atol=1e-6), p
        assert (got[i] > 0).sum() <= (p.top_k if 0 < p.top_k < VOCAB else VOCAB)


def test_every_row_draws_the_same_token_alone_and_in_any_batch() -> None:
    params = [p for p in mixed_params(27) if not p.greedy]
    logits = random_logits(len(params), 5, scale=1.0)
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        u = torch.rand(len(params), generator=g)
        together = draw(logits, params, u, Scratch()).tolist()
        alone = [draw(logits[i : i + 1], params[i : i + 1], u[i : i + 1], Scratch()).item() for i in range(len(params))]
        assert together == alone
        order = torch.randperm(len(params), generator=g).tolist()
        shuffled = draw(logits[order], [params[i] for i in order], u[order], Scratch()).tolist()
        assert shuffled == [together[i] for i in order]


def test_tokens_follow_the_filtered_distribution() -> None:
    p = SamplingParams(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])
    want = torch.tensor(reference_probs(logits[0].double().tolist(), p), dtype=torch.float32)
    n = 4000
    u = torch.from_numpy(uniforms([noise_key(1)] * n, range(n)))
    tokens = draw(logits.expand(n, -1).contiguous(), [p] * n, u, Scratch())
    counts = torch.bincount(tokens, minlength=6).float() / n
    assert counts[want == 0].sum() == 0
    assert torch.allclose(counts, want, atol=0.03)


def test_the_op_count_does_not_grow_with_the_batch() -> None:
    """A few batched ops per group of rows (the whole-vocabulary rows, each top-k, top-p without top-k), not a
    Python loop over rows: 2 rows of each kind cost as many torch calls as 16 of each."""

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def calls(rows_per_kind: int) -> int:
        kinds = [
            SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.05),
            SamplingParams(temperature=0.8),
            SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.0),
        ]
        params = [k for k in kinds for _ in range(rows_per_kind)]
        logits = random_logits(len(params), 8)
        u = torch.rand(len(params))
        Count.calls = 0
        with Count():
            draw(logits, params, u, Scratch())
        return Count.calls

    assert calls(2) == calls(16)


# -- the noise -----------------------------------------------------------------------------------------------
def test_the_noise_is_a_pure_function_of_key_and_counter() -> None:
    a = uniforms([5, 6, 5], [0, 0, 7])
    assert a.dtype == np.float32 and ((a >= 0) & (a < 1)).all()
    assert a[0] == uniforms([5], [0])[0] and a[2] == uniforms([5], [7])[0]
    assert len({float(x) for x in a}) == 3


def test_the_noise_is_uniform_and_nearby_seeds_are_independent() -> None:
    n = 20000
    for seed in (0, 1, 2):
        u = uniforms([noise_key(seed)] * n, range(n)).astype(np.float64)
        assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
        hist = np.histogram(u, bins=10, range=(0, 1))[0]
        assert (abs(hist - n / 10) < 5 * (n / 10) ** 0.5).all()
    x = uniforms([noise_key(41)] * n, range(n)).astype(np.float64)
    y = uniforms([noise_key(42)] * n, range(n)).astype(np.float64)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.03


def test_a_seeded_request_samples_the_same_alone_and_in_a_batch_of_16() -> None:
    steps = [random_logits(16, 100 + s, scale=1.5) for s in range(20)]
    others = mixed_params(15)
    for mine in (
        SamplingParams(temperature=0.8, seed=7, top_k=0, top_p=1.0, min_p=0.0),
        SamplingParams(temperature=0.8, seed=7),
        SamplingParams(temperature=1.0, seed=2**64 - 1, top_k=0, top_p=0.9, min_p=0.0),
    ):
        alone, batched_sampler = Sampler(), Sampler(seed=99)
        a = [alone.sample(s[5:6], ["me"], [mine], [[1, 2]])[0] for s in steps]
        b = []
        for s in steps:
            ids = [f"x{i}" for i in range(5)] + ["me"] + [f"x{i}" for i in range(6, 16)]
            params = others[:5] + [mine] + others[5:]
            b.append(batched_sampler.sample(s, ids, params, [[1, 2]] * 16)[5])
        assert a == b
        assert len(set(a)) > 3  # it really sampled


def test_rows_without_a_seed_are_random_and_follow_the_engine_seed() -> None:
    logits = torch.zeros(4, VOCAB)
    p = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)] * 4

    def run(engine_seed: int) -> list[int]:
        s = Sampler(seed=engine_seed)
        return [t for _ in range(5) for t in s.sample(logits, ["a", "b", "c", "d"], p, [[]] * 4)]

    assert run(3) == run(3)  # the engine's source is seeded
    assert run(3) != run(4)
    assert len(set(run(3))) > 15  # the four requests got different keys


def test_the_batched_repetition_penalty_matches_a_row_loop() -> None:
    logits = random_logits(5, 9)
    params = [SamplingParams(temperature=0, repeat_penalty=r) for r in (1.0, 1.3, 0.8, 1.1, 2.0)]
    g = torch.Generator().manual_seed(10)
    histories = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (10, 200, 3, 0, 64)]
    want = logits.clone()
    for i, p in enumerate(params):
        for t in set(histories[i][-REPEAT_LAST_N:]):
            x = want[i, t]
            want[i, t] = x / p.repeat_penalty if x > 0 else x * p.repeat_penalty
    assert torch.equal(apply_repetition_penalty(logits, params, histories), want)
    assert apply_repetition_penalty(logits, params[:1], histories[:1]) is logits  # no penalty: no copy
