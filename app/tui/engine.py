"""What the App's thread workers run: load a model, drain one reply's stream.  The results go back only as
messages (app.tui.events), posted to the App; nothing here touches a widget.

Replies are batched: text is posted at most every BATCH_S seconds, so a fast model (hundreds of tokens per
second) costs the UI a few Markdown updates per second instead of one per token.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from app.conversations import Conversation
from app.loaded import Loaded
from app.model_sampling import model_defaults
from app.requests import chat_request, sampling_from
from app.settings import Settings
from app.structured import constraint_for
from app.tui import events
from backends.api import Backend, Description, EventKind, Request
from hwprobe.errors import HearthError

log = logging.getLogger(__name__)

BATCH_S = 0.05  # seconds between two text chunks posted to the UI

Post = Callable[[Any], Any]  # App.post_message (thread-safe)


def build_request(loaded: Loaded, conv: Conversation, settings: Settings) -> Request:
    """The conversation through the one request builder (app/requests.py, as `hearth run` and the server);
    the conversation's own settings win over the app's, which win over the model's defaults (app/model_sampling.py)."""
    return chat_request(
        loaded.spec,
        conv.chat_messages(),
        sampling_from(settings, conv.settings, defaults=model_defaults(loaded.spec, loaded.entry.name)),
        constraint=constraint_for(settings.json_output),
        priority=settings.priority,  # the person at the keyboard ranks ahead of API traffic (app.defaults)
    ).request


def load_model(loader: Callable[..., Any], settings: Settings, post: Post) -> None:
    def progress(fraction: float, what: str) -> None:
        post(events.LoadProgress(fraction, what))

    try:
        loaded = loader(settings, progress=progress)
        # the Backend contract's notices (a runner's crashes and restarts) reach the UI as messages
        loaded.backend.on_notice = lambda text: post(events.RunnerNotice(text))  # type: ignore[method-assign]
        described = Description.from_mapping(loaded.backend.describe())  # a plugin's may still be a dict
        post(events.ModelReady(loaded, described, _memory(loaded.backend)))
    except Exception as exc:  # noqa: BLE001 - any failure keeps the app running; HearthErrors carry their hint
        post(events.ModelFailed(settings.model, _one_line(exc)))


def close_model(loaded: Loaded) -> None:
    """Free the old model before the next one loads (close() releases the weights; gc drops the wrappers).  Its
    runner does not stay loaded for a later command (--keep-alive): the next load's plan must see that memory
    free, and would end the runner anyway (backends/runner/resident.py)."""
    if hasattr(loaded.backend, "keep_alive_s"):  # a RunnerBackend
        loaded.backend.keep_alive_s = 0
    loaded.backend.close()
    del loaded
    gc.collect()


def drain(backend: Backend, request: Request, turn_id: int, post: Post, cancelled: Callable[[], bool]) -> None:
    parts: list[str] = []
    last = time.monotonic()
    aborted = False
    try:
        for event in backend.stream(request):
            if cancelled() and not aborted:
                backend.abort(request.request_id)  # the stream then ends with FinishReason.ABORT
                aborted = True
            if event.kind is EventKind.TOKEN and event.text:
                parts.append(event.text)
                if time.monotonic() - last >= BATCH_S:
                    post(events.ReplyChunk(turn_id, "".join(parts)))
                    parts.clear()
                    last = time.monotonic()
            elif event.kind is EventKind.FINISHED:
                if parts:
                    post(events.ReplyChunk(turn_id, "".join(parts)))
                reason = event.finish_reason.value if event.finish_reason else "stop"
                post(events.ReplyDone(turn_id, reason, event.stats, event.error, _memory(backend), event.error_code))
                return
    except Exception as exc:  # noqa: BLE001 - the reply fails, the app does not: what streamed is kept
        backend.abort(request.request_id)
        if parts:
            post(events.ReplyChunk(turn_id, "".join(parts)))
        post(events.ReplyFailed(turn_id, _one_line(exc)))
        return
    post(events.ReplyFailed(turn_id, "the backend ended the stream without finishing it"))


def _memory(backend: Backend) -> dict[str, int]:
    """Memory of the process that holds the model (the runner), from the engine's stats snapshot."""
    try:
        stats = backend.stats()
        return {"rss_bytes": stats.rss_bytes, "gpu_bytes": stats.gpu_bytes}
    except Exception:  # memory figures are informational
        log.debug("the backend's memory figures are unavailable", exc_info=True)
        return {}


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, HearthError):
        return exc.one_line()
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
