"""What one llama.cpp generation samples with: llama-cpp-python's token generator set up for a request
(seed, sampler chain, logits processors), the tokens that end it, its text stream and its grammar state."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from backends.api import SamplingParams, seed_u64
from backends.errors import InvalidRequestError
from backends.textstream import TextStream


@dataclass
class Sampling:
    """One generation's sampler state, made by start_sampling."""

    tokens: Any  # llm.generate(...): each next() decodes and yields one token id
    eos: set[int]  # token ids that end the reply
    text: TextStream  # the reply's text, detokenized, with its stop strings
    steps: Any  # logit_steps.LogitSteps (logit_bias, penalties, logprobs), or None when none is asked for
    matcher: Any  # a constrained request's grammar state (backends.constrained), or None


def start_sampling(
    llm: Any,
    sp: SamplingParams,
    ids: list[int],
    eos_ids: Sequence[int],
    token_bytes: Callable[[Sequence[int]], bytes],
    one_token_bytes: Callable[[int], bytes],
    matcher: Any = None,
) -> Sampling:
    """Seed llama.cpp's sampler and start generating after the prompt `ids` (nothing is decoded until the
    first next() of Sampling.tokens)."""
    text = TextStream(token_bytes, sp.stop)
    eos = set() if sp.ignore_eos else set(eos_ids) | {llm.token_eos()}
    processors = None
    if matcher is not None:
        # the grammar's end is end-of-sequence, even with ignore_eos; the mask runs first in llama.cpp's
        # sampler chain (llama-cpp-python adds logits processors first), where scores are indexed by token id
        eos = set(eos_ids) | {llm.token_eos()}
        processors = [masker(matcher)]
    # llama.cpp's sampler seed is 32 bits: a 64-bit seed is folded (its two halves xor-ed), so every seed is
    # deterministic and seeds that differ only in their high bits still differ
    seed = seed_u64(sp.seed) if sp.seed is not None else random.randrange(2**31)
    llm.set_seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)
    # Greedy: temperature 0 in llama.cpp's sampler chain is argmax; the other filters are then moot.
    # logit_bias, OpenAI's penalties and logprobs: backends/llama_cpp/logit_steps.py (llama.cpp's own
    # frequency/presence penalties stay 0: they count a 64-token window, OpenAI's every generated token)
    from backends.llama_cpp.logit_steps import LogitSteps  # lazy: heavy: numpy

    steps = LogitSteps(sp, len(ids), one_token_bytes) if LogitSteps.wanted(sp) else None
    gen = llm.generate(
        ids,
        top_k=sp.top_k,
        top_p=sp.top_p,
        min_p=sp.min_p,
        temp=sp.temperature,
        repeat_penalty=sp.repeat_penalty,
        reset=True,
        # bias/penalties and the raw logprobs first, the grammar's mask last
        logits_processor=([steps] if steps is not None else []) + (processors or []) or None,
    )
    return Sampling(gen, eos, text, steps, matcher)


def masker(matcher: Any) -> Callable[[Any, Any], Any]:
    """A llama-cpp-python logits processor: forbidden tokens' scores to -inf.  scores: (n_vocab,) float32."""
    import numpy as np  # lazy: heavy: numpy

    def mask(_input_ids: Any, scores: Any) -> Any:
        try:
            allowed = matcher.allowed()
        except InvalidRequestError:  # the grammar failed (a limit): matcher.accept() raises it again, typed, on
            return scores  # the token sampled now; raised here, llama-cpp-python's ctypes callback only prints it
        n = min(len(allowed), len(scores))
        scores[:n][~allowed[:n]] = -np.inf
        scores[n:] = -np.inf
        return scores

    return mask
