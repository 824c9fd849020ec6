"""The torch engine on the real starter model (CPU): greedy agreement with llama.cpp, batch and prefix-cache
independence, and one request's failure left to that request.  Marked slow; skipped until the model half
(backends.torch_engine.model_runner) is installed.

Where two token sequences differ, the test does not loosen equality: the first differing position must be a
near-tie by the one rule in tests/greedy_agreement.py (same engine: within NEAR_TIE_ULPS bf16 ulps in the
reference run's own logits, because CPUs' bf16 GEMM kernels round differently by row count; against llama.cpp:
the two backends' margins over the two differing tokens add up to at most CROSS_TIE).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from backends.api import FinishReason, LoadOptions, Request, SamplingParams
from tests.greedy_agreement import assert_backends_agree, assert_greedy_agree, reference_run

pytestmark = pytest.mark.slow
pytest.importorskip("backends.torch_engine.model_runner", reason="the torch engine's model half is not there yet")

N_TOKENS = 16
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one sentence.",
    "List three prime numbers.",
    "def fibonacci(n):",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def spec(starter_path: Path):
    from backends.modelspec import load_spec

    return load_spec(starter_path)


@pytest.fixture(scope="module")
def torch_backend(spec):
    from backends.torch_engine.backend import TorchBackend

    b = TorchBackend(spec, LoadOptions(n_ctx=1024, n_batch=256, max_num_seqs=16, device="cpu"))
    b.load()
    yield b
    b.close()


@pytest.fixture(scope="module")
def llama(spec):
    from backends.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(spec, LoadOptions(n_ctx=1024, n_threads=2, logits_all=True))
    b.load()
    yield b
    b.close()


@pytest.fixture(scope="module")
def prompts(spec, llama) -> list[tuple[int, ...]]:
    from backends.templates import render_for_spec

    out = []
    for q in QUESTIONS:
        r = render_for_spec(spec, [{"role": "user", "content": q}])
        out.append(tuple(llama.tokenize(r.text, add_special=r.add_special)))
    return out


def test_tokenizer_matches_llama_cpp(torch_backend, llama, spec) -> None:
    text = "Hello  world!\n\tdef f(x): return x**2  # ünïcödé 🙂 <|im_start|>user 12345"
    assert torch_backend.tokenize(text) == llama.tokenize(text)


def test_greedy_replies_equal_llama_cpp(torch_backend, llama, prompts) -> None:
    for p in prompts:
        ours = torch_backend.generate(Request(prompt_token_ids=p, sampling=GREEDY)).token_ids
        theirs = llama.generate(Request(prompt_token_ids=p, sampling=GREEDY)).token_ids
        assert len(ours) == len(theirs) == N_TOKENS
        assert_backends_agree(ours, theirs, p, {"torch": torch_backend.logits, "llama.cpp": llama.logits})


def test_same_tokens_alone_and_in_a_batch_of_16(torch_backend, prompts) -> None:
    target = prompts[0]
    reference, rows = reference_run(torch_backend, target, N_TOKENS)
    alone = torch_backend.generate(Request(prompt_token_ids=target, sampling=GREEDY)).token_ids
    assert_greedy_agree(reference, alone, rows, "alone, prefix cached")
    results: dict[int, tuple[int, ...]] = {}

    def run(i: int) -> None:
        p = prompts[i % len(prompts)] if i else target
        sp = GREEDY if i % 3 == 0 else SamplingParams(temperature=0.9, seed=i, max_tokens=N_TOKENS, ignore_eos=True)
        results[i] = torch_backend.generate(Request(prompt_token_ids=p, sampling=sp)).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert_greedy_agree(reference, results[0], rows, "in a batch of 16")


def test_same_tokens_after_a_prefix_cache_hit(torch_backend, prompts) -> None:
    # A long shared start (several full blocks), then two different questions.
    shared = list(prompts[2]) * 3
    first = tuple(shared + list(prompts[0]))
    miss, miss_rows = reference_run(torch_backend, first, N_TOKENS)  # cold cache: a miss
    hit = torch_backend.generate(Request(prompt_token_ids=first, sampling=GREEDY))
    assert hit.stats.cached_tokens == (len(first) - 1) // 16 * 16
    assert_greedy_agree(miss, hit.token_ids, miss_rows, "prefix-cache hit")
    other = tuple(shared + list(prompts[1]))
    partial = torch_backend.generate(Request(prompt_token_ids=other, sampling=GREEDY))
    assert partial.stats.cached_tokens >= len(shared) // 16 * 16
    fresh, fresh_rows = reference_run(torch_backend, other, N_TOKENS)
    assert_greedy_agree(fresh, partial.token_ids, fresh_rows, "shared-prefix hit")


def test_failing_requests_leave_the_other_streams_alone(torch_backend, spec, monkeypatch) -> None:
    """Issue 16 item 2: 8 greedy streams run while bad requests arrive (refused at the edge, or failing while
    the engine prepares, samples or stop-checks them, or while they are detokenized); each bad one ends with
    its own error, and all 8 finish with the tokens they get alone (tests/greedy_agreement.py's rule)."""
    from torch_engine_fakes import FAILURES, bad_sampling, inject_failures

    from backends.errors import InvalidRequestError
    from backends.templates import render_for_spec

    n = 24  # long enough to still be running when the bad requests arrive
    topics = ["the sea", "a cat", "Paris", "rain", "coffee", "a robot", "winter", "the moon"]
    good = []
    for t in topics:
        r = render_for_spec(spec, [{"role": "user", "content": f"Write one sentence about {t}."}])
        good.append(tuple(torch_backend.tokenize(r.text, add_special=r.add_special)))
    references = [reference_run(torch_backend, p, n) for p in good]

    with pytest.raises(InvalidRequestError, match="seed must be a 64-bit integer"):
        SamplingParams(seed=2**64)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        torch_backend.stream(Request(prompt_token_ids=good[0] + (spec.vocab_size,)))

    inject_failures(torch_backend, monkeypatch)
    results: dict[str, list] = {}
    running = threading.Barrier(len(good) + 1)

    def run(rid: str, prompt: tuple[int, ...], sp: SamplingParams) -> None:
        events = []
        for e in torch_backend.stream(Request(prompt_token_ids=prompt, sampling=sp, request_id=rid)):
            events.append(e)
            if len(events) == 2 and rid.startswith("good"):
                running.wait(120)
        results[rid] = events

    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    threads = [threading.Thread(target=run, args=(f"good-{i}", p, greedy)) for i, p in enumerate(good)]
    for t in threads:
        t.start()
    running.wait(120)  # every good stream has its first token
    bad = [
        threading.Thread(target=run, args=(rid, good[k % len(good)], bad_sampling(rid, n)))
        for k, rid in enumerate(FAILURES)
    ]
    for t in bad:
        t.start()
    for t in threads + bad:
        t.join(300)
    for rid, message in FAILURES.items():
        last = results[rid][-1]
        assert last.finish_reason is FinishReason.ERROR and last.error == message, (rid, last.error)
    for i in range(len(good)):
        events = results[f"good-{i}"]
        assert events[-1].finish_reason is FinishReason.LENGTH, events[-1].error
        tokens = tuple(t for e in events for t in e.token_ids)
        assert_greedy_agree(references[i][0], tokens, references[i][1], f"stream {i} among failing requests")
    for _ in range(100):  # the engine publishes its snapshot right after the step that ended the last stream
        st = torch_backend.stats()
        if st.running == st.waiting == 0 and st.kv_blocks_free == st.kv_blocks:
            break
        time.sleep(0.01)
    assert st.running == st.waiting == 0 and st.kv_blocks_free == st.kv_blocks  # the failed ones freed theirs
