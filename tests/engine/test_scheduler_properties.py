"""Property tests of the scheduler + block manager invariants over random workloads (fake model, no torch).

Whatever the pool size, token budget, batch limit, shared prefixes, aborts, priorities (with aging) and TTFT
plan: no block is both free and used
and ref counts match the block tables after every step; everything returns to the pool at the end; preemption
and prefix-cache hits never change a request's tokens (each equals the fake model's reference continuation).
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch_engine_fakes import FakePagedKV, fake_step, reference_continuation

from backends.api import SamplingParams
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.scheduler import Scheduler
from backends.torch_engine.step_cost import StepCostModel

workload = st.fixed_dictionaries(
    {
        "num_blocks": st.integers(3, 16),
        "budget": st.integers(1, 64),
        "max_num_seqs": st.integers(1, 6),
        "prefix": st.lists(st.integers(0, 96), min_size=0, max_size=40),
        "requests": st.lists(
            st.tuples(
                st.lists(st.integers(0, 96), min_size=1, max_size=30),  # own prompt tail
                st.booleans(),  # shares the prefix
                st.integers(1, 40),  # max_tokens
                st.integers(0, 3),  # arrives after this many steps
                st.integers(-2, 2),  # priority
            ),
            min_size=1,
            max_size=7,
        ),
        "aborts": st.lists(st.tuples(st.integers(0, 6), st.integers(0, 30)), max_size=3),  # (request, at step)
        "ttft_s": st.sampled_from([None, 0.02, 0.2]),  # the TTFT plan's target (10 ms a step + 1 ms a token)
    }
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workload)
@example(  # two recomputes that each needed most of the pool preempted each other forever (a CI run found it)
    w={
        "num_blocks": 3,
        "budget": 4,
        "max_num_seqs": 2,
        "prefix": [0, 0, 0, 0],
        "requests": [
            ([0], False, 33, 1, -2),
            ([0], True, 18, 1, 2),
            ([0, 0], False, 29, 1, -1),
            ([0, 0, 0], True, 16, 0, 0),
            ([0, 0, 0, 0, 0, 0, 0], True, 23, 0, -1),
        ],
        "aborts": [],
        "ttft_s": None,
    }
)
def test_invariants_hold_and_outputs_never_change(w: dict) -> None:
    bm = BlockManager(w["num_blocks"])
    clock = [0.0]
    cost = StepCostModel(min_steps=1)
    for n in (1, 1, 8, 32):  # the first is skipped (warm-up)
        cost.observe(n, 0.01 + 0.001 * n)
    s = Scheduler(
        bm,
        w["max_num_seqs"],
        w["budget"],
        max_model_len=4096,
        ttft_target_s=w["ttft_s"],
        aging_s=0.05,  # five steps: aging happens within these short workloads
        cost_model=cost,
        clock=lambda: clock[0],
    )
    kv = FakePagedKV(w["num_blocks"])
    pending = []
    for i, (tail, shared, max_tokens, arrive, priority) in enumerate(w["requests"]):
        prompt = (w["prefix"] if shared else []) + tail
        if len(prompt) >= s.max_model_len:
            prompt = prompt[: s.max_model_len - 1]
        sp = SamplingParams(temperature=0, max_tokens=max_tokens)
        pending.append(
            (arrive, EngineRequest(f"r{i}", tuple(prompt), sp, arrival_time=arrive * 0.01, priority=priority))
        )
    all_requests = [r for _, r in pending]
    aborts = {f"r{i}": at for i, at in w["aborts"] if i < len(all_requests)}
    step = 0
    while pending or s.has_unfinished:
        for item in [p for p in pending if p[0] <= step]:
            s.add_request(item[1])
            pending.remove(item)
        for rid, at in aborts.items():
            if at == step:
                s.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        out, _ = fake_step(s, kv)
        bm.check_invariants(s.running)
        assert out.total_num_tokens <= w["budget"] and len(out.scheduled) <= w["max_num_seqs"]
        assert all(not r.block_ids for r in s.waiting)  # preempted requests gave their blocks back
        assert all(rid not in s.requests or not s.requests[rid].block_ids for rid in out.preempted_ids)
        step += 1
        clock[0] += 0.01
        assert step < 5000, "no progress"
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks
    for r in all_requests:
        assert r.is_finished
        ref = reference_continuation(r.prompt_token_ids, r.sampling.max_tokens)
        if r.status is RequestStatus.FINISHED_ABORTED:
            assert r.output_token_ids == ref[: r.num_output_tokens]
        else:
            limit = min(r.sampling.max_tokens, s.max_model_len - r.num_prompt_tokens)
            assert r.output_token_ids == ref[:limit]


@settings(max_examples=40, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 96), min_size=16, max_size=70),
    tail=st.lists(st.integers(0, 96), min_size=1, max_size=20),
    budget=st.integers(1, 48),
)
def test_prefix_cache_hit_gives_the_same_tokens_as_a_miss(prefix: list[int], tail: list[int], budget: int) -> None:
    prompt = tuple(prefix + tail)
    results = []
    for caching in (False, True):
        bm = BlockManager(32, enable_prefix_caching=caching)
        s = Scheduler(bm, 4, budget, 4096)
        kv = FakePagedKV(32)
        warm = EngineRequest("warm", tuple(prefix) + (1,), SamplingParams(temperature=0, max_tokens=2))
        s.add_request(warm)
        while s.has_unfinished:
            fake_step(s, kv)
        r = EngineRequest("r", prompt, SamplingParams(temperature=0, max_tokens=6))
        s.add_request(r)
        computed = 0
        while s.has_unfinished:
            out, _ = fake_step(s, kv)
            computed += out.total_num_tokens
        results.append((r.output_token_ids, r.num_cached_tokens, computed))
        bm.check_invariants([])
    (miss_out, miss_cached, miss_work), (hit_out, hit_cached, hit_work) = results
    assert miss_out == hit_out == reference_continuation(prompt, 6)
    assert miss_cached == 0
    assert hit_cached >= min(len(prefix) // 16, (len(prompt) - 1) // 16) * 16
    assert hit_work == miss_work - hit_cached  # exactly the cached tokens are skipped, nothing else changes
