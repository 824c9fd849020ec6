"""TokenLogprob entries in OpenAI's two response shapes.

Chat (`choices[i].logprobs`): {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}, ...], "refusal": null}.
Completions (`choices[i].logprobs`, the legacy shape): {"tokens": [...], "token_logprobs": [...],
"top_logprobs": [{token: logprob, ...}, ...], "text_offset": [...]}; each top_logprobs dict holds the k most
likely tokens plus the chosen one (OpenAI: "up to logprobs + 1 elements"), and the first prompt token of an
echo has null for both (nothing comes before it).  text_offset is each token's character offset in the
choice's text, counted over the tokens' own text.

A token's text is its bytes decoded as UTF-8 (a token that holds part of a character shows U+FFFD; `bytes`
has the exact bytes).  Log-probabilities are finite numbers: -inf (a token the model gives no mass) is sent
as -9999.0, as OpenAI does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from backends.api import TokenLogprob

FLOOR = -9999.0


def _lp(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def token_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def chat_content(entries: Iterable[TokenLogprob]) -> list[dict]:
    out = []
    for e in entries:
        top = [{"token": token_text(b), "logprob": _lp(lp), "bytes": list(b)} for (_, lp), b in zip(e.top, e.top_bytes)]
        out.append(
            {
                "token": token_text(e.token_bytes),
                "logprob": _lp(e.logprob if e.logprob is not None else 0.0),
                "bytes": list(e.token_bytes),
                "top_logprobs": top,
            }
        )
    return out


def chat_logprobs(entries: Iterable[TokenLogprob]) -> dict:
    return {"content": chat_content(entries), "refusal": None}


class CompletionLogprobs:
    """The legacy shape, built token by token (a stream sends each chunk's part; `offset` runs on)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # characters of the choice's text before the next token

    def part(self, entries: Iterable[TokenLogprob]) -> dict:
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict | None] = []
        offsets: list[int] = []
        for e in entries:
            text = token_text(e.token_bytes)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if e.logprob is None:  # the first prompt token
                values.append(None)
                tops.append(None)
                continue
            values.append(_lp(e.logprob))
            top = {token_text(b): _lp(lp) for (_, lp), b in zip(e.top, e.top_bytes)}
            top.setdefault(text, _lp(e.logprob))
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
