"""Sampler: greedy, seeded reproducibility alone vs in a batch, top-k / top-p / min-p masks, penalties."""

from __future__ import annotations

import torch

from backends.api import SamplingParams
from backends.torch_engine.sampler import Sampler, filtered_probs

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)


def test_greedy_is_argmax_per_row() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    ps = [SamplingParams(temperature=0)] * 5
    assert Sampler().sample(logits, list("abcde"), ps, [[]] * 5) == logits.argmax(-1).tolist()


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch() -> None:
    g = torch.Generator().manual_seed(1)
    steps = [torch.randn(8, 300, generator=g) for _ in range(30)]
    mine = SamplingParams(temperature=0.9, seed=7)
    others = [SamplingParams(temperature=t, seed=None, **OFF) for t in (0.5, 1.3, 0.0)] + [
        SamplingParams(temperature=1.0, seed=3, top_k=5)
    ] * 4
    alone, batched = Sampler(), Sampler(seed=99)
    a = [alone.sample(s[2:3], ["me"], [mine], [[1, 2]])[0] for s in steps]
    b = []
    for s in steps:
        ids = ["x0", "x1", "me", "x3", "x4", "x5", "x6", "x7"]
        params = others[:2] + [mine] + others[2:]
        b.append(batched.sample(s, ids, params, [[1, 2]] * 8)[2])
    assert a == b
    assert len(set(a)) > 3  # it really sampled


def test_different_seeds_differ() -> None:
    logits = torch.zeros(1, 1000)
    draws = {
        Sampler().sample(logits, ["r"], [SamplingParams(temperature=1, seed=s, **OFF)], [[]])[0] for s in range(20)
    }
    assert len(draws) > 10


def test_top_k_keeps_k_tokens() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    p = filtered_probs(logits, [SamplingParams(temperature=1, top_k=2, top_p=1.0, min_p=0.0)])
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    assert torch.allclose(p.sum(), torch.tensor(1.0))


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    p = filtered_probs(probs.log(), [SamplingParams(temperature=1, top_k=0, top_p=0.8, min_p=0.0)])
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()  # 0.5 + 0.3 reaches 0.8
    p = filtered_probs(probs.log(), [SamplingParams(temperature=1, top_k=0, top_p=0.81, min_p=0.0)])
    assert (p[0, :3] > 0).all() and p[0, 3] == 0
    assert torch.allclose(p[0, :3], torch.tensor([0.5, 0.3, 0.15]) / 0.95)


def test_min_p_is_relative_to_the_best_token() -> None:
    probs = torch.tensor([[0.6, 0.3, 0.07, 0.03]])
    p = filtered_probs(probs.log(), [SamplingParams(temperature=1, top_k=0, top_p=1.0, min_p=0.1)])
    assert (p[0, :3] > 0).all() and p[0, 3] == 0  # 0.03 < 0.1 x 0.6


def test_temperature_sharpens_after_filtering() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = filtered_probs(logits, [SamplingParams(temperature=0.5, **OFF)])
    hot = filtered_probs(logits, [SamplingParams(temperature=2.0, **OFF)])
    assert cold[0, 0] > hot[0, 0]
    assert torch.allclose(cold, (logits / 0.5).softmax(-1))


def test_rows_are_filtered_independently() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    ps = [
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.2, top_p=0.5),
        SamplingParams(temperature=1.0, min_p=0.2),
    ]
    together = filtered_probs(logits, ps)
    for i in range(3):
        assert torch.equal(together[i], filtered_probs(logits[i : i + 1], [ps[i]])[0])


def test_sampled_tokens_follow_the_filtered_distribution() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]])
    sp = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=0)
    s = Sampler()
    counts = torch.zeros(4)
    for _ in range(2000):
        counts[s.sample(logits, ["r"], [sp], [[]])[0]] += 1
    expected = logits[0, :3].softmax(-1)
    assert counts[3] == 0
    assert torch.allclose(counts[:3] / 2000, expected, atol=0.04)


def test_repetition_penalty_pushes_seen_tokens_down() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.1]])
    greedy = SamplingParams(temperature=0, repeat_penalty=1.5)
    assert Sampler().sample(logits, ["r"], [greedy], [[0]])[0] == 1  # 2.0 / 1.5 < 1.9
    assert Sampler().sample(logits, ["r"], [SamplingParams(temperature=0)], [[0]])[0] == 0
    neg = torch.tensor([[-1.0, -1.1, -5.0]])
    assert Sampler().sample(neg, ["r"], [greedy], [[0]])[0] == 1  # -1.0 x 1.5 < -1.1
