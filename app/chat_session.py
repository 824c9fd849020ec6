"""A conversation with a loaded backend: messages -> chat template -> stream -> reply appended.

Used by `hearth run` (one prompt, or the interactive terminal chat).  The TUI and the API server build their
requests the same way (app/requests.py) and keep their own persistence.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from app.loading import Loaded
from app.model_sampling import model_defaults
from app.requests import FALLBACK_NAME, chat_request, sampling_from
from app.settings import Settings
from app.structured import constraint_for
from backends.api import Completion, EventKind, FinishReason, Request

_NOT_SHOWN = ("backend", "model", "path", "kernel_check_reasons")  # the reasons print as lines of their own


@dataclass
class ChatSession:
    loaded: Loaded
    settings: Settings
    stop: tuple[str, ...] = ()
    messages: list[dict[str, str]] = field(default_factory=list)
    current_request: str | None = None  # id of the request in flight, for abort()

    def __post_init__(self) -> None:
        if not self.messages and self.settings.system_prompt:
            self.messages.append({"role": "system", "content": self.settings.system_prompt})
        self.fallback_warned = False
        # the model's sampling defaults fill what the user did not set (app/model_sampling.py)
        self.defaults = model_defaults(self.loaded.backend.spec, self.loaded.entry.name)

    def print_plan(self, out: TextIO) -> None:
        d = self.loaded.decision
        info = self.loaded.backend.describe()
        print(
            f"hearth: {self.loaded.entry.name} on {d.backend} "
            f"({', '.join(f'{k}={v}' for k, v in info.items() if k not in _NOT_SHOWN)})",
            file=out,
        )
        # the plan's reasons, then the engine's own: which kernels its self-check replaced on this device
        for reason in (*d.reasons, *info.get("kernel_check_reasons", ())):
            print(f"  - {reason}", file=out)
        if self.defaults.values():
            print(f"  - sampling defaults: {self.defaults.describe()} (flags and settings.toml win)", file=out)

    def reset(self) -> None:
        system = [m for m in self.messages[:1] if m["role"] == "system"]
        self.messages = system

    def set_system(self, text: str) -> None:
        self.messages = [m for m in self.messages if m["role"] != "system"]
        if text:
            self.messages.insert(0, {"role": "system", "content": text})

    def send(self, text: str, *, raw: bool = False, on_text: Callable[[str], None] | None = None) -> Completion:
        """Send a user message (or a raw prompt), stream the reply to on_text, keep it in the history.
        An aborted or failed turn keeps the history as it was, plus what was generated."""
        backend = self.loaded.backend
        if raw:
            request = Request(
                prompt=text,
                sampling=sampling_from(self.settings, stop=self.stop, defaults=self.defaults),
                constraint=constraint_for(self.settings.json_output),
                priority=self.settings.priority,
            )
        else:
            self.messages.append({"role": "user", "content": text})
            try:
                built = chat_request(
                    self.loaded.spec,
                    self.messages,
                    sampling_from(self.settings, stop=self.stop, defaults=self.defaults),
                    constraint=constraint_for(self.settings.json_output),
                    priority=self.settings.priority,  # ahead of API traffic by default (app.defaults)
                )
            except BaseException:
                self.messages.pop()  # a refused template or setting keeps the history as it was
                raise
            if built.template_source == FALLBACK_NAME and not self.fallback_warned:
                print(
                    f"hearth: {self.loaded.entry.name} has no chat template; using hearth's plain "
                    "'User:/Assistant:' format",
                    file=sys.stderr,
                )
                self.fallback_warned = True
            request = built.request
        self.current_request = request.request_id
        parts: list[str] = []
        ids: list[int] = []
        try:
            for event in backend.stream(request):
                if event.kind is EventKind.TOKEN:
                    if event.text:
                        parts.append(event.text)
                        if on_text:
                            on_text(event.text)
                    ids.extend(event.token_ids)
                elif event.kind is EventKind.FINISHED:
                    assert event.finish_reason is not None and event.stats is not None
                    reply = "".join(parts)
                    if not raw:
                        self.messages.append({"role": "assistant", "content": reply})
                    return Completion(
                        request.request_id,
                        reply,
                        tuple(ids),
                        event.finish_reason,
                        event.stats,
                        event.error,
                        event.error_code,
                    )
        except BaseException:
            backend.abort(request.request_id)
            if not raw and self.messages and self.messages[-1]["role"] == "user":
                if parts:
                    self.messages.append({"role": "assistant", "content": "".join(parts)})
                else:
                    self.messages.pop()
            raise
        finally:
            self.current_request = None
        raise AssertionError("stream ended without FINISHED")


def print_stats(result: Completion, out: TextIO) -> None:
    s = result.stats
    line = (
        f"[{result.finish_reason.value}] prompt {s.prompt_tokens} tok"
        f"{f' ({s.cached_tokens} cached)' if s.cached_tokens else ''}, "
        f"reply {s.completion_tokens} tok, first token {s.ttft_s * 1000:.0f} ms, "
        f"prefill {s.prefill_tokens_per_s:.1f} tok/s, decode {s.decode_tokens_per_s:.1f} tok/s"
    )
    if s.spec_proposed_tokens:
        rate = s.spec_accepted_tokens / s.spec_proposed_tokens
        line += f", speculative {s.spec_accepted_tokens}/{s.spec_proposed_tokens} accepted ({rate:.0%})"
    print(line, file=out)
    if result.finish_reason is FinishReason.ERROR and result.error:
        print(f"hearth: error: {result.error}", file=out)
