"""Speculative decoding in the torch engine with a fake model (CPU, fast): prompt lookup, adaptive k, rollback of
rejected tokens' KV inside continuous batching, greedy losslessness, the rejection-sampling rule's distribution
and seeded reproducibility.  The real-model tests are in tests/engine_model/test_speculative_model.py."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import pytest
import torch
from torch_engine_fakes import FakePagedKV

from backends.api import LoadOptions, SamplingParams
from backends.errors import ConfigError
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.draw import uniforms
from backends.torch_engine.engine import Engine
from backends.torch_engine.request import EngineRequest
from backends.torch_engine.sampler import Sampler, filtered_probs
from backends.torch_engine.scheduler import Scheduler
from backends.torch_engine.seams import RunnerOutput, SchedulerOutput
from backends.torch_engine.speculative.ngram import NgramProposer
from backends.torch_engine.speculative.proposer import MAX_BACKOFF_STEPS, Proposal, SpecConfig, SpecState
from backends.torch_engine.speculative.speculator import Speculator
from backends.torch_engine.speculative.verify import accept_matching, rejection_row

VOCAB = 50


def periodic_next(context: Sequence[int]) -> int:
    """A model that copies: the token 7 places back (prompt lookup's best case)."""
    return context[-7] if len(context) >= 7 else (context[-1] + 1) % VOCAB


def hashed_next(context: Sequence[int]) -> int:
    """A model whose next token is a hash of the context (prompt lookup's proposals are almost always wrong)."""
    return zlib.crc32(",".join(map(str, context)).encode()) % VOCAB


class SpecFakeRunner:
    """Logits from a pure function of the context read back through the block tables (FakePagedKV), for every
    token of a speculative row: argmax = next_fn(context), the rest a context-seeded random spread."""

    def __init__(self, num_blocks: int, next_fn, spread: float = 4.0, gap: float = 1.0) -> None:
        self.kv = FakePagedKV(num_blocks)
        self.next_fn = next_fn
        self.spread = spread
        self.gap = gap  # the argmax's logit over the spread's top
        self.steps: list[SchedulerOutput] = []

    def row(self, ctx: Sequence[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(repr(list(ctx)).encode()))
        row = torch.rand(VOCAB, generator=g) * self.spread
        row[self.next_fn(ctx)] = self.spread + self.gap
        return row

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.steps.append(out)
        for s in out.scheduled:
            for j, t in enumerate(s.token_ids):
                self.kv.slots[self.kv._slot(s.block_table, s.start_position + j)] = t
        ids, rows, spec = [], [], {}
        for s in out.scheduled:
            if not s.needs_logits:
                continue
            ctx = [self.kv.slots[self.kv._slot(s.block_table, p)] for p in range(s.end_position)]
            assert None not in ctx
            ids.append(s.request_id)
            rows.append(self.row(ctx))
            if s.num_spec_tokens:
                first = s.end_position - s.num_spec_tokens
                spec[s.request_id] = torch.stack([self.row(ctx[:p]) for p in range(first, s.end_position + 1)])
        return RunnerOutput(tuple(ids), torch.stack(rows) if rows else torch.empty(0, VOCAB), spec_logits=spec)


def engine(
    next_fn,
    speculate: bool = True,
    num_blocks: int = 256,
    budget: int = 64,
    seqs: int = 16,
    rows: int = 16,
    gap: float = 1.0,
):
    bm = BlockManager(num_blocks)
    sched = Scheduler(bm, seqs, budget, 4096)
    config = SpecConfig("ngram", k_max=8, max_batch_rows=rows)
    spec = Speculator(NgramProposer(4, 2), config) if speculate else None
    return Engine(SpecFakeRunner(num_blocks, next_fn, gap=gap), sched, Sampler(0), spec)


def run(e: Engine, requests: list[EngineRequest], limit: int = 5000) -> dict[str, list[int]]:
    for r in requests:
        e.add_request(r)
    steps = 0
    while e.has_work:
        e.step()
        e.scheduler.block_manager.check_invariants(e.scheduler.running)
        steps += 1
        assert steps < limit
    e.scheduler.block_manager.check_invariants([])
    return {r.request_id: r.output_token_ids for r in requests}


def reference(next_fn, prompt: Sequence[int], n: int, eos: frozenset[int] = frozenset()) -> list[int]:
    ctx, out = list(prompt), []
    for _ in range(n):
        t = next_fn(ctx)
        out.append(t)
        ctx.append(t)
        if t in eos:
            break
    return out


def greedy(rid: str, prompt: Sequence[int], n: int, eos: frozenset[int] = frozenset()) -> EngineRequest:
    return EngineRequest(rid, tuple(prompt), SamplingParams(temperature=0, max_tokens=n), eos)


# -- prompt lookup and adaptive k -------------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_longest_earlier_suffix() -> None:
    p = NgramProposer(4, 2)
    tokens = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert p.lookup("a", tokens, 3) == (4, 5, 9)  # "2 3" was followed by 4 5 9
    assert p.lookup("b", [1, 2, 3, 1, 2, 8, 1, 2], 2) == (8, 1)  # the latest occurrence of "1 2" wins
    assert p.lookup("c", [5, 6, 7, 8], 4) == ()  # no earlier occurrence of any 2..4-gram suffix
    assert p.lookup("d", [1, 2, 3, 1, 2], 0) == ()
    # incremental: the index grows with the tokens and answers as a fresh scan would
    q, grow = NgramProposer(4, 2), [3, 1, 4, 1, 5, 9, 2, 6]
    for t in [5, 3, 1, 4, 1, 5]:
        grow.append(t)
        assert q.lookup("x", grow, 4) == NgramProposer(4, 2).lookup("y", grow, 4)


def test_k_adapts_to_acceptance_and_backs_off_when_nothing_is_accepted() -> None:
    s = SpecState(k=4)
    s.record(4, 4, k_max=8)
    assert s.k == 8 and s.wants()  # accepting: the cap is k_max, the cost model picks within it
    s.record(8, 2, k_max=8)
    assert s.k == 8  # a partial acceptance keeps the cap (the acceptance estimate already prices it)
    s.record(3, 0, k_max=8)  # one miss (a sampled reply's noise, maybe): k 1, no back-off yet
    assert s.k == 1 and s.wants() and s.backoff == 0
    s.record(1, 0, k_max=8)  # two in a row: one plain step, then two, four, ...
    assert s.k == 1 and [s.wants() for _ in range(2)] == [False, True]
    s.record(1, 0, k_max=8)
    assert [s.wants() for _ in range(3)] == [False, False, True]
    for _ in range(10):
        s.record(1, 0, k_max=8)
    assert s.backoff == MAX_BACKOFF_STEPS
    s.record(1, 1, k_max=8)
    assert s.backoff == 0 and s.misses == 0 and s.k == 8 and s.wants()
    s.record(8, 0, k_max=8)  # after an acceptance, a miss is again a first miss
    assert s.wants() and s.k == 1


def test_block_manager_trim_returns_the_blocks_past_the_computed_tokens() -> None:
    bm = BlockManager(8, block_size=4)
    r = greedy("a", list(range(6)), 10)
    assert bm.allocate(r, 6)
    r.num_computed_tokens = 6
    assert bm.allocate(r, 1 + 8)  # a speculative row of 9 tokens: positions up to 15, four blocks
    assert len(r.block_ids) == 4 and bm.num_free_blocks == 4
    r.num_computed_tokens = 8  # two proposals accepted of eight
    bm.trim(r)
    assert len(r.block_ids) == 2 and bm.num_free_blocks == 6
    bm.check_invariants([r])


# -- greedy losslessness and rollback inside continuous batching ---------------------------------------------
@pytest.mark.parametrize("next_fn", [periodic_next, hashed_next], ids=["copying", "never-right"])
def test_greedy_output_is_token_for_token_the_same_with_speculation(next_fn) -> None:
    prompts = {f"r{i}": [(3 * i + j * j) % VOCAB for j in range(5 + 9 * i)] for i in range(6)}
    lengths = {f"r{i}": 20 + 7 * i for i in range(6)}
    e = engine(next_fn)
    got = run(e, [greedy(rid, p, lengths[rid]) for rid, p in prompts.items()])
    for rid, p in prompts.items():
        assert got[rid] == reference(next_fn, p, lengths[rid]), rid
    spec = e.speculator
    if next_fn is periodic_next:  # copying text: most proposals accepted, several tokens per step
        assert spec.num_accepted > 0.8 * spec.num_proposed and spec.num_accepted > 100
        assert len(e.runner.steps) < sum(lengths.values()) / 2
    else:
        assert spec.num_accepted < spec.num_proposed


def test_nothing_accepted_costs_at_most_a_few_verification_rows() -> None:
    """A model that never agrees with the proposals: the back-off leaves almost every step a plain decode."""

    def contrary(ctx: Sequence[int]) -> int:  # one more than whatever prompt lookup would propose
        guess = NgramProposer(4, 2).lookup("fresh", ctx, 1)
        return (guess[0] + 1) % VOCAB if guess else ctx[-3]

    e = engine(contrary)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 4]  # repeats: prompt lookup always has a proposal
    out = run(e, [greedy("a", prompt, 400)])
    assert len(out["a"]) == 400
    wide = sum(1 for step in e.runner.steps for s in step.scheduled if s.num_spec_tokens)
    decodes = sum(1 for step in e.runner.steps for s in step.scheduled if s.request_id == "a") - 1
    assert wide <= decodes / 16, (wide, decodes)  # a verification row at most once in 16 steps


def test_rejected_kv_is_rolled_back_and_never_cached() -> None:
    """Prefix-cache hashes only cover accepted tokens: a second request with the first one's output as its
    prompt hits the cache for exactly the blocks of real tokens, and its reply is still the reference."""
    e = engine(hashed_next)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 3]
    a = run(e, [greedy("a", prompt, 40)])["a"]
    assert a == reference(hashed_next, prompt, 40)
    again = prompt + a
    b = greedy("b", again, 10)
    assert run(e, [b])["b"] == reference(hashed_next, again, 10)
    assert b.num_cached_tokens == (len(again) - 1) // 16 * 16  # every full block of accepted tokens


def test_stop_inside_accepted_proposals_ends_the_reply_there() -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    eos = frozenset({9})
    e = engine(periodic_next)
    got = run(e, [greedy("a", prompt, 30, eos), greedy("b", prompt, 3)])
    assert got["a"] == reference(periodic_next, prompt, 30, eos) and got["a"][-1] == 9
    assert got["b"] == reference(periodic_next, prompt, 3)  # max_tokens caps the proposals too


def test_rows_without_proposals_decode_as_before_in_the_same_batch() -> None:
    e = engine(periodic_next)
    rows = [greedy("copy", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], 30), greedy("fresh", [40], 30)]
    rows.append(
        EngineRequest("biased", (1, 2, 3, 1, 2), SamplingParams(temperature=0, max_tokens=30, logit_bias=((4, 1.0),)))
    )
    run(e, rows)
    spec_rows = {s.request_id for step in e.runner.steps for s in step.scheduled if s.num_spec_tokens}
    assert "copy" in spec_rows and "biased" not in spec_rows  # a bias is not what verification reproduces
    assert rows[0].output_token_ids == reference(periodic_next, rows[0].prompt_token_ids, 30)


def test_big_batches_decode_plainly() -> None:
    """Steps with more decode rows than max_batch_rows carry no proposals (a big batch is compute-bound)."""
    e = engine(periodic_next, rows=2)
    prompts = {f"b{i}": [(i + j) % 7 + 1 for j in range(12)] for i in range(4)}
    got = run(e, [greedy(rid, p, 12) for rid, p in prompts.items()])
    for step in e.runner.steps:
        if sum(1 for s in step.scheduled if s.is_decode or s.num_spec_tokens) > 2:
            assert not any(s.num_spec_tokens for s in step.scheduled)
    assert all(got[rid] == reference(periodic_next, p, 12) for rid, p in prompts.items())


def test_speculation_survives_preemption() -> None:
    """A pool too small for every stream: requests are preempted and recomputed, proposals keep flowing."""
    e = engine(periodic_next, num_blocks=12, seqs=8)
    prompts = {f"p{i}": [(i + j) % 7 + 1 for j in range(20)] for i in range(5)}
    got = run(e, [greedy(rid, p, 40) for rid, p in prompts.items()])
    assert e.scheduler.num_preemptions > 0
    for rid, p in prompts.items():
        assert got[rid] == reference(periodic_next, p, 40)


# -- sampled rows: the target distribution, reproducibly ---------------------------------------------------
def _tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


@pytest.mark.parametrize("draft", [False, True], ids=["point-mass", "draft-q"])
def test_verification_keeps_the_target_distribution(draft: bool) -> None:
    """6,000 verifications of the same 2-proposal row (fixed keys, so this cannot flake): the first emitted
    token is distributed as p_0, and the second, given the first proposal was accepted, as p_1; total variation
    within 0.04 / 0.05 of the exact distributions (the expected sampling error is ~0.012 / ~0.02).  Point mass:
    draw-and-compare through the sampler; a draft's q: the rejection rule."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, generator=g) * 1.5
    params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    p = filtered_probs(logits, [params] * 3)
    proposal = (int(p[0].argsort()[-2]), 2)  # the second most likely: accepted and rejected often
    q = torch.softmax(torch.randn(2, 6, generator=g), dim=-1) if draft else None
    cdf = q.double().cumsum(-1) if draft else None
    sampler = Sampler(0)
    first, second = torch.zeros(6), torch.zeros(6)
    for key in range(6_000):
        if draft:  # a draft's proposals are drawn from its q (the rule's premise)
            u = uniforms([key] * 2, [1000, 1001])
            proposal = tuple(int(torch.searchsorted(cdf[j], float(u[j]))) for j in range(2))
            row = rejection_row(logits, proposal, params, q, key=key * 7919 + 1, position=100)
        else:
            seeded = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=key)
            targets = sampler.sample_ahead(logits, [f"r{key}"] * 3, [seeded] * 3, [0, 1, 2])
            row = accept_matching(targets, proposal)
        first[row[0]] += 1
        if len(row) > 1:  # the first proposal was accepted: the next token is p_1's
            second[row[1]] += 1
    assert _tv(first, p[0]) < 0.04
    assert second.sum() > 600 and _tv(second, p[1]) < 0.05


def test_sample_ahead_draws_what_plain_decoding_draws_next() -> None:
    """Row j of sample_ahead is the token sample() gives after j more draws (the counter plain decoding uses)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, VOCAB, generator=g) * 2
    sp = SamplingParams(temperature=0.8, seed=99)
    ahead = Sampler(0).sample_ahead(logits, ["a"] * 4, [sp] * 4, [0, 1, 2, 3])
    plain = Sampler(0)
    assert ahead == [plain.sample(logits[j : j + 1], ["a"], [sp], [()])[0] for j in range(4)]


def test_seeded_sampled_output_is_the_same_with_and_without_speculation() -> None:
    """Draw-and-compare keeps plain decoding's tokens exactly: same seed, same text, speculation on or off (a
    peaked copying model: most proposals accepted, some rejected)."""
    prompt = (1, 2, 3, 4, 5, 6, 7, 1, 2, 3)
    for seed in (1, 2, 3):
        sp = SamplingParams(temperature=0.7, seed=seed, max_tokens=40)
        on = engine(periodic_next, gap=2.0)
        got = run(on, [EngineRequest("a", prompt, sp)])["a"]
        assert got == run(engine(periodic_next, speculate=False, gap=2.0), [EngineRequest("a", prompt, sp)])["a"]
        assert on.speculator is not None
        assert 0 < on.speculator.num_accepted < on.speculator.num_proposed


def test_seeded_sampled_rows_are_reproducible_alone_and_batched() -> None:
    sp = SamplingParams(temperature=0.8, seed=1234, max_tokens=40)
    prompt = (1, 2, 3, 4, 5, 6, 7, 1, 2, 3)
    alone = run(engine(periodic_next), [EngineRequest("a", prompt, sp)])["a"]
    others = [
        EngineRequest(f"o{i}", (i, i + 1, i + 2) * 3, SamplingParams(temperature=1.0, max_tokens=30)) for i in range(5)
    ]
    batched = run(engine(periodic_next), [*others[:2], EngineRequest("a", prompt, sp), *others[2:]])["a"]
    assert alone == batched and len(alone) == 40


def test_load_options_refuse_bad_speculative_settings() -> None:
    with pytest.raises(ConfigError, match="off, ngram, draft or auto"):
        LoadOptions(speculative="fast")
    with pytest.raises(ConfigError, match="--draft-model"):
        LoadOptions(speculative="draft")
    with pytest.raises(ConfigError, match="speculative_k"):
        LoadOptions(speculative="ngram", speculative_k=0)


def test_a_proposer_failing_verification_fails_those_rows_alone() -> None:
    class Broken(NgramProposer):
        def propose(self, requests, ks):
            return [Proposal((VOCAB + 5,) * k) for k in ks]  # ids past the vocabulary: verification raises

    bm = BlockManager(64)
    e = Engine(
        SpecFakeRunner(64, periodic_next),
        Scheduler(bm, 4, 64, 4096),
        Sampler(0),
        Speculator(Broken(), SpecConfig("ngram")),
    )
    a = EngineRequest("a", (1, 2, 3), SamplingParams(temperature=0.7, max_tokens=5))
    e.add_request(a)
    updates = []
    while e.has_work:
        updates += e.step()
    assert updates[-1].finished and updates[-1].error is not None
    bm.check_invariants([])
