"""OpenAI's logit steps, applied row by row before the sampler's filters: logit_bias, presence_penalty and
frequency_penalty (OpenAI's definitions, as SamplingParams documents them):

    logit[t] += bias[t]
    logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]

where count[t] is how often t appears among the tokens generated so far (the prompt does not count, and there
is no window: unlike llama.cpp's own penalty sampler, which looks at its last 64 accepted tokens).  Rows that
ask for none of it pay nothing: the input tensor is returned untouched when no row has work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.api import SamplingParams


def has_openai_adjustments(params: SamplingParams) -> bool:
    return params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or bool(params.logit_bias)


def apply_bias_and_openai_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                                    outputs: Sequence[Sequence[int]]) -> torch.Tensor:
    """logits: (rows, vocab) float32; outputs: each row's generated tokens so far.  Returns a new tensor when
    some row changes, else `logits` itself."""
    rows = [i for i, p in enumerate(params) if has_openai_adjustments(p)]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        p = params[i]
        if (p.presence_penalty or p.frequency_penalty) and outputs[i]:
            ids, counts = torch.unique(torch.tensor(list(outputs[i]), dtype=torch.long, device=logits.device),
                                       return_counts=True)
            logits[i, ids] -= p.presence_penalty + p.frequency_penalty * counts.to(logits.dtype)
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=logits.device)
            logits[i].index_add_(0, ids, torch.tensor([b for _, b in p.logit_bias], dtype=logits.dtype,
                                                      device=logits.device))
    return logits
