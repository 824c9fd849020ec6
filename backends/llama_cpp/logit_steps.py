"""OpenAI's sampling surface on llama.cpp: logit_bias, presence/frequency penalties and log-probabilities
through llama-cpp-python's `logits_processor` (a custom sampler first in its chain, handed the raw logits of
every token in id order), and prompt log-probabilities through an evaluation of the prompt that keeps every
position's logits.

Penalties are applied here rather than by llama.cpp's penalty sampler: that one counts the last 64 tokens it
accepted, while OpenAI's (and the torch engine's, backends/torch_engine/penalties.py) count every generated
token, and never the prompt.  The formula is the same:  logit[t] += bias[t] - presence * (count[t] > 0) -
frequency * count[t].  llama.cpp's repetition penalty comes after, in its own sampler (as in the torch engine).

Log-probabilities are of the raw logits (before all of the above), as TokenLogprob documents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from backends.api import SamplingParams, TokenLogprob


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    s = scores.astype(np.float64)
    m = s.max()
    return (s - (m + np.log(np.exp(s - m).sum()))).astype(np.float32)


def _top(lsm: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    if k <= 0:
        return ()
    part = np.argpartition(-lsm, k - 1)[:k]
    order = part[np.argsort(-lsm[part], kind="stable")]
    return tuple((int(t), float(lsm[t])) for t in order)


class LogitSteps:
    """The logits processor of one request.  Called by llama.cpp's sampler with (tokens so far, raw logits);
    `entry(token)` then gives the sampled token's TokenLogprob (when sampling.logprobs is set)."""

    def __init__(self, params: SamplingParams, num_prompt_tokens: int, token_bytes: Callable[[int], bytes]) -> None:
        self.params = params
        self.num_prompt_tokens = num_prompt_tokens
        self.token_bytes = token_bytes
        self._lsm: np.ndarray | None = None  # the last call's log-softmax
        self._bias_ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
        self._bias = np.array([b for _, b in params.logit_bias], dtype=np.float32)

    @staticmethod
    def wanted(params: SamplingParams) -> bool:
        return (
            params.logprobs is not None
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
            or bool(params.logit_bias)
        )

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        p = self.params
        if p.logprobs is not None:
            self._lsm = _log_softmax(scores)
        if not (p.presence_penalty or p.frequency_penalty or p.logit_bias):
            return scores
        out = np.array(scores, dtype=np.float32, copy=True)
        generated = np.asarray(input_ids[self.num_prompt_tokens :], dtype=np.int64)
        if generated.size and (p.presence_penalty or p.frequency_penalty):
            ids, counts = np.unique(generated, return_counts=True)
            out[ids] -= np.float32(p.presence_penalty) + np.float32(p.frequency_penalty) * counts.astype(np.float32)
        if self._bias_ids.size:
            np.add.at(out, self._bias_ids, self._bias)
        return out

    def entry(self, token: int) -> TokenLogprob | None:
        if self._lsm is None:
            return None
        top = _top(self._lsm, self.params.logprobs or 0)
        return TokenLogprob(
            int(token),
            float(self._lsm[token]),
            top,
            self.token_bytes(int(token)),
            tuple(self.token_bytes(t) for t, _ in top),
        )


def eval_prompt_scored(
    llm: Any, ids: Sequence[int], k: int, token_bytes: Callable[[int], bytes]
) -> tuple[TokenLogprob, ...]:
    """Evaluate the whole prompt from position 0, keeping every position's logits (per batch: no context
    loaded with logits_all is needed), and return one TokenLogprob per prompt token (the first one's logprob
    None).  Leaves `llm` as its own eval() does, so a generate() of the same ids samples at once without
    evaluating them again.  Costs: the prompt is never taken from llama.cpp's prefix reuse."""
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    vocab = llm.n_vocab()
    entries = [TokenLogprob(int(ids[0]), None, (), token_bytes(int(ids[0])))]
    for lo in range(0, len(ids), llm.n_batch):
        batch = list(ids[lo : lo + llm.n_batch])
        llm._batch.set_batch(batch=batch, n_past=llm.n_tokens, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[llm.n_tokens : llm.n_tokens + len(batch)] = batch
        llm.n_tokens += len(batch)
        llm._requires_eval = False
        rows = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(batch) * vocab,)).reshape(len(batch), vocab)
        for j in range(len(batch)):  # row j scores token lo + j + 1
            pos = lo + j + 1
            if pos >= len(ids):
                break
            lsm = _log_softmax(rows[j])
            token = int(ids[pos])
            top = _top(lsm, k)
            entries.append(
                TokenLogprob(token, float(lsm[token]), top, token_bytes(token), tuple(token_bytes(t) for t, _ in top))
            )
    return tuple(entries)
