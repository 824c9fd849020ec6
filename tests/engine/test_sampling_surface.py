"""OpenAI's sampling surface in the torch engine, without a model: logit_bias and presence/frequency penalties
against a plain-Python reference, log-probabilities against a direct log-softmax, prompt log-probabilities
chunk by chunk, and the scheduler's prefix-cache rule for requests that want them."""

from __future__ import annotations

import math

import pytest
import torch

from backends.api import SamplingParams
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.logprobs import chunk_prompt_logprobs, sampled_logprobs
from backends.torch_engine.penalties import apply_bias_and_openai_penalties
from backends.torch_engine.request import EngineRequest
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import Scheduler

VOCAB = 40


def reference_adjust(row: list[float], p: SamplingParams, generated: list[int]) -> list[float]:
    """OpenAI's definition, one token at a time in plain Python."""
    out = list(row)
    for t in range(len(out)):
        count = generated.count(t)
        out[t] -= p.presence_penalty * (count > 0) + p.frequency_penalty * count
    for t, b in p.logit_bias:
        out[t] += b
    return out


def test_bias_and_penalties_match_the_plain_reference_row_by_row() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=g)
    params = [
        SamplingParams(temperature=0, presence_penalty=0.7, frequency_penalty=0.3),
        SamplingParams(temperature=0),  # asks for nothing: unchanged
        SamplingParams(temperature=0, logit_bias={3: -100, 5: 2.5}, frequency_penalty=-1.5),
        SamplingParams(temperature=0, presence_penalty=-2, logit_bias={0: 100}),
    ]
    outputs = [[1, 1, 2, 7, 1], [1, 2, 3], [5, 5, 9], []]
    got = apply_bias_and_openai_penalties(logits, params, outputs)
    for i, p in enumerate(params):
        want = reference_adjust(logits[i].tolist(), p, outputs[i])
        assert got[i].tolist() == pytest.approx(want, abs=1e-5), i
    assert torch.equal(got[1], logits[1])


def test_rows_without_adjustments_pay_nothing() -> None:
    logits = torch.randn(3, VOCAB)
    assert apply_bias_and_openai_penalties(logits, [SamplingParams()] * 3, [[1, 2]] * 3) is logits


def test_penalties_count_generated_tokens_only_not_the_prompt() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 4] = 1.0  # the prompt's token 4 is the best; a penalty over the prompt would hide it
    sp = SamplingParams(temperature=0, presence_penalty=2.0, frequency_penalty=2.0)
    assert Sampler().sample(logits, ["r"], [sp], [[4, 4, 4]], [3]) == [4]
    assert Sampler().sample(logits, ["r"], [sp], [[4, 4, 4, 4]], [3]) != [4]  # once generated, it pays


def test_a_minus_100_bias_bans_the_greedy_choice_and_plus_100_forces_a_token() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    best = int(logits[0].argmax())
    banned = SamplingParams(temperature=0, logit_bias={best: -100})
    forced = SamplingParams(temperature=1.0, seed=1, logit_bias={17: 100}, top_k=0, top_p=1.0, min_p=0.0)
    tokens = Sampler().sample(logits, ["a", "b"], [banned, forced], [[], []])
    assert tokens[0] != best and tokens[0] == int(logits[0].topk(2).indices[1])
    assert tokens[1] == 17


def test_sampled_logprobs_are_the_raw_log_softmax_with_top_k() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    ref = torch.log_softmax(logits.double(), dim=-1)
    entries = sampled_logprobs(logits, [2, 9, 30], [0, 3, 20])
    for i, (e, token, k) in enumerate(zip(entries, [2, 9, 30], [0, 3, 20])):
        assert e.token_id == token and math.isclose(e.logprob, ref[i, token].item(), abs_tol=1e-5)
        assert len(e.top) == k
        assert [t for t, _ in e.top] == ref[i].topk(k).indices.tolist()
        assert all(a >= b for (_, a), (_, b) in zip(e.top, e.top[1:]))  # best first


def test_prompt_logprobs_chunk_by_chunk_equal_the_whole_prompt() -> None:
    prompt = [3, 14, 15, 9, 2, 6, 5, 35, 8, 9]
    logits = torch.randn(len(prompt), VOCAB, generator=torch.Generator().manual_seed(7))  # after each position
    ref = torch.log_softmax(logits.double(), dim=-1)
    pieces = []
    for start in (0, 4, 8):  # chunks of 4, 4 and 2 tokens: the last row scores no prompt token
        pieces += chunk_prompt_logprobs(logits[start : start + 4], prompt, start, 2)
    assert [e.token_id for e in pieces] == prompt[1:]
    for pos, e in enumerate(pieces, start=1):
        assert math.isclose(e.logprob, ref[pos - 1, prompt[pos]].item(), abs_tol=1e-5)
        assert len(e.top) == 2


def test_a_request_with_prompt_logprobs_skips_the_prefix_cache_and_scores_every_chunk() -> None:
    bm = BlockManager(32)
    s = Scheduler(bm, 4, 16, 512)
    prompt = tuple(range(1, 41))  # 40 tokens: 2 full blocks could be cached
    first = EngineRequest("a", prompt, SamplingParams(temperature=0, max_tokens=1))
    s.add_request(first)
    while s.has_unfinished:
        out = s.schedule()
        s.update(out, {x.request_id: 0 for x in out.scheduled if x.needs_logits})
    assert bm.num_cached_blocks == 2
    scored = EngineRequest("b", prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=True))
    plain = EngineRequest("c", prompt, SamplingParams(temperature=0, max_tokens=1))
    s.add_request(scored)
    s.add_request(plain)
    out = s.schedule()
    by_id = {x.request_id: x for x in out.scheduled}
    assert by_id["b"].start_position == 0 and by_id["b"].all_logits  # the whole prompt, with every row
    assert scored.num_cached_tokens == 0 and scored.prompt_logprobs[0].logprob is None
    assert "c" not in by_id or by_id["c"].start_position == 32  # the other one reuses the cache
    chunks = [by_id["b"]]
    s.update(out, {})
    while "b" in s.requests:
        out = s.schedule()
        chunks += [x for x in out.scheduled if x.request_id == "b"]
        s.update(out, {x.request_id: 0 for x in out.scheduled if x.needs_logits})
    assert [c.all_logits for c in chunks] == [True, True, True]  # 16 + 16 + 8 tokens, every one scores


def test_a_long_chunk_is_scored_in_slices_with_the_same_values() -> None:
    prompt = [(7 * i) % VOCAB for i in range(150)]  # more rows than ROWS_AT_ONCE
    logits = torch.randn(150, VOCAB, generator=torch.Generator().manual_seed(9))
    ref = torch.log_softmax(logits.double(), dim=-1)
    entries = chunk_prompt_logprobs(logits, prompt, 0, 1)
    assert [e.token_id for e in entries] == prompt[1:]
    assert [e.logprob for e in entries] == pytest.approx(
        [ref[p - 1, prompt[p]].item() for p in range(1, 150)], abs=1e-5
    )
