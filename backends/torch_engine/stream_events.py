"""The caller's side of one torch-engine stream: the engine thread's messages (Started, Token, Finished) become
GenerationEvents in the caller's thread, with detokenizing, stop strings and log-probability bytes done there, so
a slow reader never slows the batch (backends/torch_engine/backend.py owns the engine thread)."""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable, Iterator

from backends.api import EventKind, FinishReason, GenerationEvent, Request, RequestStats, TokenLogprob
from backends.textstream import TextStream
from backends.torch_engine.messages import Finish, Finished, InboxMessage, Started, StreamMessage, Token
from backends.torch_engine.parts import Tokenizer
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.scheduler import error_line

_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


def stream_events(
    tokenizer: Tokenizer,
    request: Request,
    er: EngineRequest,
    out: queue.SimpleQueue,
    post: Callable[[InboxMessage], None],
) -> Iterator[GenerationEvent]:
    """The caller's side of one stream: turns engine messages into GenerationEvents.  Detokenizing fails
    this stream alone: it ends with FinishReason.ERROR and the engine drops the request."""
    rid, sp = request.request_id, request.sampling
    stats = RequestStats(prompt_tokens=er.num_prompt_tokens)
    text = TextStream(tokenizer.token_bytes, sp.stop)
    started = done = False
    reason, error, error_code = FinishReason.ERROR, None, None
    try:
        while True:
            msg: StreamMessage = out.get()
            prompt_logprobs: tuple[TokenLogprob, ...] = ()
            if isinstance(msg, Started):
                stats.cached_tokens, stats.queue_s = msg.cached_tokens, msg.queue_s
                prompt_logprobs = tuple(with_bytes(tokenizer, e) for e in msg.prompt_logprobs)
            if not started:
                started = True
                yield GenerationEvent(EventKind.STARTED, rid, stats=stats, prompt_logprobs=prompt_logprobs)
            if isinstance(msg, Token):
                if stats.completion_tokens == 0:
                    stats.ttft_s = msg.at - er.arrival_time
                stats.completion_tokens += 1
                if msg.status is RequestStatus.FINISHED_STOPPED and msg.token_id in er.eos_token_ids:
                    reason = FinishReason.STOP  # the end-of-sequence token is counted, never shown
                    break
                try:
                    piece, stopped = text.push([msg.token_id])
                except Exception as exc:  # noqa: BLE001 - this stream's failure, not the batch's
                    reason, error = FinishReason.ERROR, error_line("detokenizing failed", exc)
                    post(Finish(rid, RequestStatus.FINISHED_ERROR, notify=False))
                    break
                yield GenerationEvent(
                    EventKind.TOKEN,
                    rid,
                    text=piece,
                    token_ids=(msg.token_id,),
                    logprobs=(with_bytes(tokenizer, msg.logprob),) if msg.logprob else (),
                )
                if stopped:
                    reason = FinishReason.STOP
                    post(Finish(rid, RequestStatus.FINISHED_STOPPED, notify=False))
                    break
                if msg.status is not None:
                    reason = _REASONS[msg.status]
                    break
            elif isinstance(msg, Finished):
                reason, error, error_code = _REASONS[msg.status], msg.error, msg.error_code
                break
        if error is None:
            try:
                tail = text.flush()
            except Exception as exc:  # noqa: BLE001 - as above
                tail, reason, error = "", FinishReason.ERROR, error_line("detokenizing failed", exc)
            if tail:
                yield GenerationEvent(EventKind.TOKEN, rid, text=tail)
        stats.total_s = time.perf_counter() - er.arrival_time
        # written by the engine thread before the last message this stream got; it touches them no more
        stats.spec_proposed_tokens, stats.spec_accepted_tokens = er.num_spec_proposed, er.num_spec_accepted
        done = True
        yield GenerationEvent(
            EventKind.FINISHED, rid, finish_reason=reason, stats=stats, error=error, error_code=error_code
        )
    finally:
        if not done:  # the caller stopped reading (closed the generator): free the request's blocks
            post(Finish(rid, RequestStatus.FINISHED_ABORTED, notify=False))


def with_bytes(tokenizer: Tokenizer, entry: TokenLogprob) -> TokenLogprob:
    """The entry with its tokens' bytes (special tokens as their text), from the tokenizer."""
    return dataclasses.replace(
        entry,
        token_bytes=_one_token_bytes(tokenizer, entry.token_id),
        top_bytes=tuple(_one_token_bytes(tokenizer, t) for t, _ in entry.top),
    )


def _one_token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    return tokenizer.token_bytes([token_id]) or tokenizer.decode([token_id]).encode()
