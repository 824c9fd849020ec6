"""The torch engine on the real starter model (CPU): greedy agreement with llama.cpp, batch and prefix-cache
independence.  Marked slow; skipped until the model half (backends.torch_engine.model_runner) is installed.

Where two token sequences differ, the test does not loosen equality: it checks that the first differing
position is a floating-point near-tie.  Within the torch engine (alone vs batch, hit vs miss) only reduction
order differs, so its top-2 logits there must be within NEAR_TIE.  Against llama.cpp the arithmetic differs
for real: ggml quantizes activations to 8 bits inside its quantized matmuls and keeps an f16 KV cache, which
moves this Q4_1 model's logits by up to ~0.8 (max abs, logits spanning ~35); e.g. the first reply token to
"What is the capital of France?" is a 0.09 tie in llama.cpp itself ("L" vs "The").  So there both backends
must have the same two tokens on top, within CROSS_TIE of each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from backends.api import LoadOptions, Request, SamplingParams

pytestmark = pytest.mark.slow
pytest.importorskip("backends.torch_engine.model_runner", reason="the torch engine's model half is not there yet")

NEAR_TIE = 0.05  # logits units, same engine, different batch / cache
CROSS_TIE = 0.5  # logits units, torch engine vs llama.cpp
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


def _near_tie(backend, ids: list[int]) -> float:
    """Gap between the best and second-best next-token logits after `ids` (torch engine)."""
    last = np.sort(backend.logits(ids)[-1])
    return float(last[-1] - last[-2])


def _assert_same_or_near_tie(backend, prompt: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> None:
    if a == b:
        return
    i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
    gap = _near_tie(backend, list(prompt) + list(a[:i]))
    assert gap < NEAR_TIE, f"tokens differ at {i} ({a[i]} vs {b[i]}) but the logits gap is {gap:.4f}: a real bug"


def _assert_same_as_llama(ours_b, llama, prompt: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> None:
    if a == b:
        return
    i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
    ctx = list(prompt) + list(a[:i])
    for name, backend in (("torch", ours_b), ("llama.cpp", llama)):
        row = backend.logits(ctx)[-1]
        top2 = np.argsort(-row)[:2]
        gap = float(row[top2[0]] - row[top2[1]])
        assert set(top2.tolist()) == {a[i], b[i]} and gap < CROSS_TIE, (
            f"tokens differ at {i} ({a[i]} vs {b[i]}); {name}'s top two are {top2.tolist()} {gap:.3f} apart")


def test_tokenizer_matches_llama_cpp(torch_backend, llama, spec) -> None:
    text = "Hello  world!\n\tdef f(x): return x**2  # ünïcödé 🙂 <|im_start|>user 12345"
    assert torch_backend.tokenize(text) == llama.tokenize(text)


def test_greedy_replies_equal_llama_cpp(torch_backend, llama, prompts) -> None:
    for p in prompts:
        ours = torch_backend.generate(Request(prompt_token_ids=p, sampling=GREEDY)).token_ids
        theirs = llama.generate(Request(prompt_token_ids=p, sampling=GREEDY)).token_ids
        assert len(ours) == len(theirs) == N_TOKENS
        _assert_same_as_llama(torch_backend, llama, p, ours, theirs)


def test_same_tokens_alone_and_in_a_batch_of_16(torch_backend, prompts) -> None:
    target = prompts[0]
    alone = torch_backend.generate(Request(prompt_token_ids=target, sampling=GREEDY)).token_ids
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
    _assert_same_or_near_tie(torch_backend, target, alone, results[0])


def _reset_prefix_cache(backend) -> None:
    backend._call(backend._engine.scheduler.block_manager.reset_prefix_cache)  # on the engine thread


def test_same_tokens_after_a_prefix_cache_hit(torch_backend, prompts) -> None:
    # A long shared start (several full blocks), then two different questions.
    shared = list(prompts[2]) * 3
    first = tuple(shared + list(prompts[0]))
    _reset_prefix_cache(torch_backend)
    miss = torch_backend.generate(Request(prompt_token_ids=first, sampling=GREEDY))
    hit = torch_backend.generate(Request(prompt_token_ids=first, sampling=GREEDY))
    assert miss.stats.cached_tokens == 0 and hit.stats.cached_tokens == (len(first) - 1) // 16 * 16
    _assert_same_or_near_tie(torch_backend, first, miss.token_ids, hit.token_ids)
    other = tuple(shared + list(prompts[1]))
    partial = torch_backend.generate(Request(prompt_token_ids=other, sampling=GREEDY))
    assert partial.stats.cached_tokens >= len(shared) // 16 * 16
    _reset_prefix_cache(torch_backend)
    fresh = torch_backend.generate(Request(prompt_token_ids=other, sampling=GREEDY))
    assert fresh.stats.cached_tokens == 0
    _assert_same_or_near_tie(torch_backend, other, partial.token_ids, fresh.token_ids)
