"""OpenAI's logit steps, applied row by row before the sampler's filters: logit_bias, presence_penalty and
frequency_penalty (OpenAI's definitions, as SamplingParams documents them):

    logit[t] += bias[t]
    logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]

where count[t] is how often t appears among the tokens generated so far (the prompt does not count, and there
is no window: unlike llama.cpp's own penalty sampler, which looks at its last 64 accepted tokens).  Rows that
ask for none of it pay nothing: the input tensor is returned untouched when no row has work.
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
