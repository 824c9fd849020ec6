"""Log-probabilities for the API's logprobs: log-softmax of the raw logits (before penalties, logit_bias,
temperature and the top-k/top-p/min-p filters, as TokenLogprob documents), the chosen token's value and the k
most likely tokens.  Only rows that ask are computed; the rest pay nothing.

Token ids only: the text and bytes of each token are filled by the backend's caller thread (it holds the
tokenizer), so this module stays a pure function of tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.api import TokenLogprob

ROWS_AT_ONCE = 64  # prompt rows log-softmaxed together


def sampled_logprobs(logits: torch.Tensor, tokens: Sequence[int], ks: Sequence[int]) -> list[TokenLogprob]:
    """One TokenLogprob per row: row i's log-probability of tokens[i] and its ks[i] best tokens.
    logits: (rows, vocab), raw."""
    if not len(tokens):
        return []
    lsm = logits.float().log_softmax(dim=-1)  # (rows, vocab)
    index = torch.tensor(list(tokens), dtype=torch.long, device=lsm.device).unsqueeze(1)
    chosen = lsm.gather(1, index).squeeze(1).tolist()
    k_max = max(ks)
    top_v, top_i = lsm.topk(k_max, dim=-1) if k_max else (None, None)
    out = []
    for i, (token, k) in enumerate(zip(tokens, ks)):
        top = tuple(zip(top_i[i, :k].tolist(), top_v[i, :k].tolist())) if k else ()
        out.append(TokenLogprob(int(token), float(chosen[i]), top))
    return out


def chunk_prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], start: int, k: int) -> list[TokenLogprob]:
    """The prompt tokens scored by one prefill chunk.  logits: (m, vocab), the logits after positions
    start .. start + m - 1, so row j scores prompt[start + j + 1]; rows past the prompt's end are ignored.
    Returns the entries for positions start + 1 .. min(start + m, len(prompt) - 1)."""
    end = min(start + logits.shape[0], len(prompt) - 1)  # last position scored
    out: list[TokenLogprob] = []
    for lo in range(start, end, ROWS_AT_ONCE):  # bounds the log-softmax's copy (a 262k vocabulary: 64 MiB)
        hi = min(lo + ROWS_AT_ONCE, end)
        out += sampled_logprobs(logits[lo - start : hi - start], prompt[lo + 1 : hi + 1], [k] * (hi - lo))
    return out
