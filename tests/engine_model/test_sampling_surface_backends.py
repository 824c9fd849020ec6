"""Logprobs, prompt logprobs, logit_bias and OpenAI's penalties on both real backends, with a tiny random-weight
GGUF (tests/gguf_factory.py): every value agrees with a direct log-softmax of the backend's own logits(), and
penalised greedy output equals a reference loop that applies OpenAI's formula to those logits.

The torch engine runs in float32 with chunks of 16 tokens, so prompts span several prefill chunks; llama.cpp
runs without logits_all (how `hearth serve` loads it), its reference backend with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.api import LoadOptions, Request, SamplingParams
from backends.modelspec import load_spec
from tests.gguf_factory import write_tiny_llama

pytestmark = pytest.mark.slow

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it rested under a tall tree while the sun "
    "went down over the quiet hills."
)
TOL = 2e-3  # float32 logits of one position computed alone vs in a batch, on any CPU's kernels


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def pair(request, tiny):
    """(backend under test, reference backend whose logits() the values are checked against)."""
    spec = load_spec(tiny)
    if request.param == "torch":
        from backends.torch_engine.backend import TorchBackend

        b = TorchBackend(spec, LoadOptions(n_ctx=256, n_batch=16, max_num_seqs=4, dtype="float32", device="cpu"))
        b.load()
        yield b, b
        b.close()
    else:
        from backends.llama_cpp.backend import LlamaCppBackend

        b = LlamaCppBackend(spec, LoadOptions(n_ctx=256, n_batch=16, n_threads=2))
        ref = LlamaCppBackend(spec, LoadOptions(n_ctx=256, n_batch=16, n_threads=2, logits_all=True))
        b.load()
        ref.load()
        yield b, ref
        b.close()
        ref.close()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def test_logprobs_and_prompt_logprobs_equal_a_log_softmax_of_the_logits(pair) -> None:
    b, ref = pair
    ids = b.tokenize(TEXT)
    assert len(ids) > 16  # several prefill chunks on the torch engine
    b.generate(Request(prompt_token_ids=ids, sampling=SamplingParams(temperature=0, max_tokens=2)))  # warm cache
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=4, prompt_logprobs=True)
    c = b.generate(Request(prompt_token_ids=ids, sampling=sp))
    assert c.stats.cached_tokens == 0  # scored prompts are computed whole, never taken from a cache
    lsm = log_softmax(ref.logits(list(ids) + list(c.token_ids)))
    assert len(c.prompt_logprobs) == len(ids) and c.prompt_logprobs[0].logprob is None
    for pos in range(1, len(ids)):
        e = c.prompt_logprobs[pos]
        assert e.token_id == ids[pos] and abs(e.logprob - lsm[pos - 1, ids[pos]]) < TOL, pos
        assert len(e.top) == 4 and abs(e.top[0][1] - lsm[pos - 1].max()) < TOL
    assert len(c.logprobs) == len(c.token_ids) == 6
    for j, (e, token) in enumerate(zip(c.logprobs, c.token_ids)):
        row = lsm[len(ids) - 1 + j]
        assert e.token_id == token and abs(e.logprob - row[token]) < TOL
        assert [t for t, _ in e.top][0] == token  # greedy: the chosen token is the most likely
        assert e.token_bytes == b.detokenize([token]).encode() and len(e.top_bytes) == 4


def reference_greedy(ref, ids: list[int], sp: SamplingParams, n: int) -> list[int]:
    """OpenAI's penalties and logit_bias applied to the backend's own logits, one token at a time."""
    out: list[int] = []
    for _ in range(n):
        row = ref.logits(ids + out)[-1].astype(np.float64)
        tokens, counts = np.unique(np.array(out, dtype=np.int64), return_counts=True)
        row[tokens] -= sp.presence_penalty + sp.frequency_penalty * counts
        for t, bias in sp.logit_bias:
            row[t] += bias
        out.append(int(row.argmax()))
    return out


@pytest.mark.parametrize(
    "kw", [dict(frequency_penalty=1.5), dict(presence_penalty=2.0), dict(frequency_penalty=-0.5, presence_penalty=1.0)]
)
def test_penalised_greedy_equals_the_reference_loop(pair, kw) -> None:
    b, ref = pair
    ids = b.tokenize(TEXT)
    plain = b.generate(
        Request(prompt_token_ids=ids, sampling=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    ).token_ids
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **kw)
    got = b.generate(Request(prompt_token_ids=ids, sampling=sp)).token_ids
    assert list(got) == reference_greedy(ref, list(ids), sp, 8)
    if kw.get("frequency_penalty", 0) > 0:
        assert got != plain  # the tiny model repeats itself: the penalty changes that


def test_logit_bias_bans_and_forces(pair) -> None:
    b, _ = pair
    ids = b.tokenize(TEXT)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = b.generate(Request(prompt_token_ids=ids, sampling=greedy)).token_ids[0]
    banned = b.generate(
        Request(
            prompt_token_ids=ids,
            sampling=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={first: -100}),
        )
    ).token_ids
    assert first not in banned
    forced = b.generate(
        Request(
            prompt_token_ids=ids,
            sampling=SamplingParams(
                temperature=1.0,
                seed=3,
                top_k=0,
                top_p=1.0,
                min_p=0.0,
                max_tokens=4,
                ignore_eos=True,
                logit_bias={1234: 100},
            ),
        )
    ).token_ids
    assert forced == (1234,) * 4
