"""The one request builder: a conversation and sampling settings become a backend Request.

`hearth run` (app/chat_session.py), the TUI (app/tui/engine.py) and the API server (app/server/app.py) all call
`chat_request`, so a conversation reaches a model the same way from each: the model's own chat template
(backends.templates, budgeted in its worker process), the format's extra stop strings after the caller's, and
the messages themselves on the Request for backends that apply the template on their side (the remote backend:
its server renders with the model's template, which hearth does not have).

The sampling settings differ on purpose: `hearth run` and the TUI take hearth's defaults (app.defaults), the
server takes what each OpenAI request says (OpenAI's defaults: temperature 1, no top_k / min_p), so callers make
the SamplingParams (`sampling_from` for Settings) and this module only adds the stops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.api import ChatMessage, Constraint, Request, SamplingParams
from backends.modelspec import REMOTE_FORMAT, ModelSpec
from backends.templates import FALLBACK_NAME, check_messages, render_chat, render_for_spec


@dataclass(frozen=True)
class ChatRequest:
    request: Request
    template_source: str  # "gguf" | "hearth-plain" (the model has no template: callers say so) | "server"


def sampling_from(settings: Any, chat: Any = None, stop: tuple[str, ...] = ()) -> SamplingParams:
    """SamplingParams from Settings; a TUI conversation's own settings (ChatSettings: temperature, top_p,
    max_tokens, seed) win over them where it has them."""
    source = chat if chat is not None else settings
    return SamplingParams(temperature=source.temperature, top_p=source.top_p, top_k=settings.top_k,
                          min_p=settings.min_p, repeat_penalty=settings.repeat_penalty, seed=source.seed,
                          max_tokens=source.max_tokens, stop=stop)


def chat_request(spec: ModelSpec, messages: Sequence[Mapping[str, Any]], sampling: SamplingParams, *,
                 request_id: str | None = None, constraint: Constraint | None = None) -> ChatRequest:
    """The Request for a conversation: rendered with `spec`'s template (raises TemplateError / InvalidRequestError
    for a bad conversation or template), `sampling.stop` first, then the format's own stop strings.

    A remote model's server applies its template itself: the prompt is then hearth's plain transcript (what a
    text-completion endpoint would be sent), without the plain format's stop strings, and the messages go as
    they are.  `constraint` makes the reply structured (JSON; app/structured.py, the server's response_format)."""
    checked = check_messages(messages)
    if spec.format == REMOTE_FORMAT:
        rendered = render_chat(checked, template=None)
        extra: tuple[str, ...] = ()
        source = "server"
    else:
        rendered = render_for_spec(spec, checked)
        extra = rendered.stop
        source = rendered.template_source
    stop = sampling.stop + tuple(s for s in extra if s not in sampling.stop)
    ids = {"request_id": request_id} if request_id is not None else {}
    request = Request(prompt=rendered.text, add_special=rendered.add_special,
                      sampling=dataclasses.replace(sampling, stop=stop),
                      messages=tuple(ChatMessage(m["role"], m["content"]) for m in checked), constraint=constraint,
                      **ids)
    return ChatRequest(request, source)


__all__ = ["FALLBACK_NAME", "ChatRequest", "chat_request", "sampling_from"]
