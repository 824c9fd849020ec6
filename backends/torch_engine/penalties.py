"""The logit steps before the sampler's filters.  OpenAI's: logit_bias, presence_penalty and
frequency_penalty (OpenAI's definitions, as SamplingParams documents them):

    logit[t] += bias[t]
    logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]

where count[t] is how often t appears among the tokens generated so far (the prompt does not count, and there
is no window: unlike llama.cpp's own penalty sampler, which looks at its last 64 accepted tokens).  Rows that
ask for none of it pay nothing: the input tensor is returned untouched when no row has work.

Then llama.cpp's repetition penalty (apply_repetition_penalty), over the last 64 tokens, prompt included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from backends.api import SamplingParams


def has_openai_adjustments(params: SamplingParams) -> bool:
    return params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or bool(params.logit_bias)


def apply_bias_and_openai_penalties(
    logits: torch.Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]
) -> torch.Tensor:
    """logits: (rows, vocab) float32; outputs: each row's generated tokens so far.  Returns a new tensor when
    some row changes, else `logits` itself.  Every change of every row is one scatter-add: the counting is
    plain Python over the generated tokens (a few hundred per row), the tensor work one op whatever the batch."""
    rows: list[int] = []
    tokens: list[int] = []
    deltas: list[float] = []
    for i, p in enumerate(params):
        if not has_openai_adjustments(p):
            continue
        if p.presence_penalty or p.frequency_penalty:
            for token, count in Counter(outputs[i]).items():
                rows.append(i)
                tokens.append(token)
                deltas.append(-(p.presence_penalty + p.frequency_penalty * count))
        for token, bias in p.logit_bias:
            rows.append(i)
            tokens.append(token)
            deltas.append(bias)
    if not rows:
        return logits
    device = logits.device
    logits = logits.clone()  # the raw logits stay as they are: log-probabilities are read from them
    logits.index_put_(
        (torch.tensor(rows, device=device), torch.tensor(tokens, device=device)),
        torch.tensor(deltas, dtype=logits.dtype, device=device),
        accumulate=True,
    )
    return logits


REPEAT_LAST_N = 64  # tokens looked back at by the repetition penalty (llama.cpp's penalty_last_n default)


def apply_repetition_penalty(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[Sequence[int]]
) -> torch.Tensor:
    """llama.cpp's repetition penalty: a token among the row's last REPEAT_LAST_N tokens has its logit divided by
    the penalty when positive, multiplied when negative.  One gather and one scatter for every penalised row of
    the batch; returns `logits` itself when no row has a penalty, else a new tensor."""
    rows: list[int] = []
    tokens: list[int] = []
    penalties: list[float] = []
    for i, p in enumerate(params):
        if p.repeat_penalty == 1.0 or not histories[i]:
            continue
        seen = set(histories[i][-REPEAT_LAST_N:])
        rows += [i] * len(seen)
        tokens += seen
        penalties += [p.repeat_penalty] * len(seen)
    if not rows:
        return logits
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
    penalty = torch.tensor(penalties, dtype=logits.dtype, device=device)
    values = logits[index]
    logits = logits.clone()
    logits[index] = torch.where(values > 0, values / penalty, values * penalty)
    return logits
