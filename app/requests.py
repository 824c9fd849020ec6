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
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.defaults import SAMPLING
from app.model_sampling import FIELDS as SAMPLING_FIELDS
from app.model_sampling import pick
from backends.api import API_PRIORITY, ChatMessage, Constraint, Request, SamplingParams
from backends.errors import TemplateError
from backends.modelspec import REMOTE_FORMAT, ModelSpec
from backends.sampling_defaults import SamplingDefaults
from backends.templates import FALLBACK_NAME, RenderedPrompt, check_messages, render_chat, render_for_spec
from backends.tools.detect import ToolStyle, detect
from backends.tools.render import (
    ToolReading,
    constraint_for,
    has_tool_fields,
    message_from_dict,
    reading_for,
    template_inputs,
)
from backends.tools.spec import ToolRequest, ToolRequestError


@dataclass(frozen=True)
class ChatRequest:
    request: Request
    template_source: str  # "gguf" | "hearth-plain" (the model has no template: callers say so) | "server"
    tools: ToolReading | None = None  # how to read tool calls out of the reply; None = the request has no tools


def sampling_from(
    settings: Any, chat: Any = None, stop: tuple[str, ...] = (), defaults: SamplingDefaults | None = None
) -> SamplingParams:
    """SamplingParams for `hearth run` and the chat app: each value the TUI conversation's own (ChatSettings:
    temperature, top_p, max_tokens, seed) where it has one, else the user's Settings where set, else the model's
    `defaults` (app/model_sampling.py: the user's own for the model over its recommendation), else hearth's
    (app.defaults.SAMPLING)."""
    given = {name: getattr(settings, name) for name in SAMPLING_FIELDS}
    if chat is not None:
        given.update(temperature=chat.temperature, top_p=chat.top_p)
    fallback = {name: getattr(SAMPLING, name) for name in SAMPLING_FIELDS}
    values = pick(given, defaults or SamplingDefaults(), fallback)
    source = chat if chat is not None else settings
    return SamplingParams(
        temperature=float(values["temperature"]),
        top_p=float(values["top_p"]),
        top_k=int(values["top_k"]),
        min_p=float(values["min_p"]),
        repeat_penalty=float(values["repeat_penalty"]),
        seed=source.seed,
        max_tokens=source.max_tokens,
        stop=stop,
    )


def chat_request(
    spec: ModelSpec,
    messages: Sequence[Mapping[str, Any]],
    sampling: SamplingParams,
    *,
    request_id: str | None = None,
    constraint: Constraint | None = None,
    tools: ToolRequest | None = None,
    priority: int = API_PRIORITY,
    template_vars: Mapping[str, Any] | None = None,
) -> ChatRequest:
    """The Request for a conversation: rendered with `spec`'s template (raises TemplateError / InvalidRequestError
    for a bad conversation or template), `sampling.stop` first, then the format's own stop strings.

    Tools (backends/tools): the template family's format is detected from the template; the tools and any tool
    calls / results in the history are rendered by the template itself where it can, else in hearth's
    Hermes-style format; a forced tool_choice adds the Constraint that makes the reply one valid call.

    A remote model's server applies its template itself: the prompt is then hearth's plain transcript (what a
    text-completion endpoint would be sent), without the plain format's stop strings, and the messages (and the
    tools, as OpenAI JSON) go as they are.  `constraint` makes the reply structured (JSON; app/structured.py, the
    server's response_format); a forced tool_choice brings its own, so the two together are refused.
    `template_vars`: more variables for the model's template (Ollama's `think` as `enable_thinking`)."""
    checked = check_messages(messages)
    chat = tuple(message_from_dict(i, m) for i, m in enumerate(checked))
    remote = spec.format == REMOTE_FORMAT
    # a remote server renders and forces the calls itself; its backend writes them back as Hermes-style text
    style = detect(spec.chat_template if not remote else None, spec.architecture)
    reading = None
    variables: dict[str, Any] = {}
    if (tools is not None or has_tool_fields(chat)) and not remote:
        checked, variables = template_inputs(chat, style, tools)
    variables = {**(template_vars or {}), **variables}
    if tools is not None:
        constraint = _tool_constraint(style, tools, constraint, remote=remote)
        reading = reading_for(style, tools)
    if remote:
        rendered = render_chat(checked, template=None)
        extra: tuple[str, ...] = ()
        source = "server"
    else:
        rendered = _render_local(spec, chat, checked, variables, style, tools, template_vars)
        extra = rendered.stop
        source = rendered.template_source
    stop = sampling.stop + tuple(s for s in extra if s not in sampling.stop)
    ids = {"request_id": request_id} if request_id is not None else {}
    remote_tools = _remote_tools(tools) if remote and tools is not None else {}
    request = Request(
        prompt=rendered.text,
        add_special=rendered.add_special,
        sampling=dataclasses.replace(sampling, stop=stop),
        messages=chat,
        constraint=constraint,
        priority=priority,
        **remote_tools,
        **ids,
    )
    return ChatRequest(request, source, reading)


def _tool_constraint(
    style: ToolStyle, tools: ToolRequest, constraint: Constraint | None, *, remote: bool
) -> Constraint | None:
    """The reply's constraint with tools: a forced tool_choice brings its own (a local model's; a remote server
    forces the call itself), and refuses a JSON response format beside it."""
    if tools.forced and constraint is not None:
        raise ToolRequestError(
            "a forced tool_choice and a JSON response format both constrain the reply; send one of them",
            "tool_choice",
        )
    if not remote and tools.forced:
        return constraint_for(style, tools)
    return constraint


def _render_local(
    spec: ModelSpec,
    chat: tuple[ChatMessage, ...],
    checked: list[dict[str, Any]],
    variables: dict[str, Any],
    style: ToolStyle,
    tools: ToolRequest | None,
    template_vars: Mapping[str, Any] | None,
) -> RenderedPrompt:
    """The conversation rendered with the model's own template (its worker process)."""
    try:
        return render_for_spec(spec, checked, extra=variables)
    except TemplateError:
        # hearth's tool block added a system message to a template that refuses them: put it in the first
        # user message instead (a conversation that had a system message already fails the same way again)
        if tools is None or not tools.rendered or style.native or any(m.role == "system" for m in chat):
            raise
        checked, variables = template_inputs(chat, style, tools, system_role=False)
        variables = {**(template_vars or {}), **variables}
        return render_for_spec(spec, checked, extra=variables)


def _remote_tools(tools: ToolRequest) -> dict[str, Any]:
    """The tools as the remote backend forwards them (OpenAI JSON text); its server parses the calls itself."""
    choice: Any = (
        tools.choice if tools.choice != "function" else {"type": "function", "function": {"name": tools.function}}
    )
    return {"tools": json.dumps([t.openai() for t in tools.tools]), "tool_choice": json.dumps(choice)}


__all__ = ["FALLBACK_NAME", "ChatRequest", "chat_request", "sampling_from"]
