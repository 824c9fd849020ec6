"""The messages between the torch engine's thread and its callers' threads (pure Python, no torch).

Inbox (callers -> engine thread, under the backend's condition variable): `Add`, `Finish`, `Call`.
Outbox (engine thread -> one stream's queue): `Started`, then `Token`*, and `Finished` when the engine ends the
stream without a token (abort, error, close).  A `Call`'s answer goes to its own queue as a `Reply`.
Every message is a frozen dataclass, so what crosses a thread is never mutated after it is sent.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backends.api import TokenLogprob
from backends.torch_engine.request import EngineRequest, RequestStatus


# -- to the engine thread ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Add:
    """Start a stream: the engine queues `request` and answers on `out`."""

    request: EngineRequest  # handed over: from now on only the engine thread touches it
    out: queue.SimpleQueue = field(compare=False)  # the stream's outbox (Started / Token / Finished)


@dataclass(frozen=True)
class Finish:
    """End a request wherever it is (abort, a stop string found by the caller, a closed generator)."""

    request_id: str
    status: RequestStatus  # a finished status
    notify: bool  # also send Finished to the stream (abort() does; the stream itself ending does not need it)


@dataclass(frozen=True)
class Call:
    """Run `fn` on the engine thread between steps (torch work, prefix-cache resets); answer with a Reply."""

    fn: Callable[[], Any]
    reply: queue.SimpleQueue = field(compare=False)


InboxMessage = Add | Finish | Call


# -- from the engine thread ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Started:
    """The request's first step ran."""

    cached_tokens: int  # prompt tokens taken from the prefix cache
    queue_s: float  # seconds from submission to the first step
    # sampling.prompt_logprobs: one entry per prompt token (ids only; the caller's thread adds the bytes).  Such
    # a request is announced once its whole prompt is scored, not after its first step
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Token:
    """One sampled token; `status` is set when this token ended the request."""

    token_id: int
    status: RequestStatus | None  # None: more tokens follow
    at: float  # perf_counter when it was sampled
    logprob: TokenLogprob | None = None  # sampling.logprobs: this token's (ids only, as Started's)


@dataclass(frozen=True)
class Finished:
    """The engine ended the stream without a token: aborted, failed (error says how) or the backend closed."""

    status: RequestStatus
    error: str | None = None  # one line, for FinishReason.ERROR
    error_code: str | None = None  # GenerationEvent.error_code of that error ("constraint_limit"), else None


StreamMessage = Started | Token | Finished


@dataclass(frozen=True)
class Reply:
    """A Call's answer: its value, or the exception it raised (re-raised in the caller's thread)."""

    value: Any = None
    error: BaseException | None = None
