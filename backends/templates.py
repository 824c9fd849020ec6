"""Chat templates: a conversation becomes prompt text with the model's own `tokenizer.chat_template`.

The template comes from the model file, so it is untrusted code, run under a budget:

- it renders only in Jinja's ImmutableSandboxedEnvironment, tightened so that touching an unsafe attribute
  (`''.__class__.__mro__`) raises at once instead of quietly rendering as empty; `range` stops at 100,000
  items (Jinja's sandbox), `lipsum` at 10,000 words;
- it renders in a separate worker process (`backends/template_worker.py`, managed by
  `backends/template_process.py`) with a wall-clock limit (TEMPLATE_TIME_LIMIT_S), an address-space limit
  (TEMPLATE_MEMORY_BYTES on top of the worker's own start-up size) and an output limit (MAX_PROMPT_CHARS).

Why a process and not hooks in the sandbox: hooks (call/getattr/binop interception, a byte-counting output, a
deadline checked per loop iteration) see only what Jinja routes through them.  An empty nested loop, a `~`
concatenation that doubles a namespace value, `'x' * 10**9`, `9 ** 9 ** 9` or a huge `str.format` width run
as one uninterruptible C call or between hooks, and no in-process check bounds the memory they take.  A child
process is bounded by construction: the kernel enforces the memory limit (MemoryError inside the worker) and
the parent kills it (SIGKILL) when the time is up, whatever it was doing; the caller's thread and, under
`hearth serve`, the event loop never run template code.  The normal case stays cheap: one worker per hearth
process, started at the first render (~0.1 s) and reused, and a render costs one pipe round trip (a ChatML
render of a short conversation is well under a millisecond; docs/performance.md "Smaller costs" has the measurements).

Every failure is a TemplateError (exit 2; a 400 under the server) with a one-line message that names the
budget it broke; a template is never silently swapped for another format.

A model without a template (base models such as Gemma 3 270M) gets hearth's documented fallback, the plain
transcript format below, and `RenderedPrompt.template_source` says so, so callers show it rather than guess:

    <system prompt, if any>\n\n
    User: <message>\n
    Assistant: <message>\n
    ...
    Assistant:

with "\nUser:" as an extra stop string so a base model does not write the user's next turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.errors import InvalidRequestError
from backends.template_process import shared

ROLES = ("system", "user", "assistant", "tool")
FALLBACK_NAME = "hearth-plain"  # what template_source says when the fallback format was used
FALLBACK_STOP = ("\nUser:",)
MAX_PROMPT_CHARS = 8_000_000  # far beyond any context; a template writing more is broken or hostile
TEMPLATE_TIME_LIMIT_S = 2.0  # wall clock for one render (a real one of a 1 MiB conversation takes ~0.1 s)
TEMPLATE_MEMORY_BYTES = 512 * 2**20  # memory one render may use (the worker's limit above its start-up size)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # the prompt text, special tokens written as text (tokenize with parse_special)
    add_special: bool  # False when the template already wrote the BOS token itself
    template_source: str  # "gguf" (the model's own) | "hearth-plain" (fallback) | "custom"
    stop: tuple[str, ...] = ()  # extra stop strings the format needs


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate a conversation: a non-empty list of {role, content} with known roles and string content."""
    if not messages:
        raise InvalidRequestError("the conversation has no messages")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ROLES:
            raise InvalidRequestError(f"message {i} has role {role!r}; roles are {', '.join(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str):
            raise InvalidRequestError(f"message {i} ({role}) needs text content, got {type(content).__name__}")
        out.append(dict(m))
    return out


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    template: str | None,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """Render `messages` with `template` (the model's) or, when None, the documented fallback."""
    msgs = check_messages(messages)
    if template is None:
        return _render_fallback(msgs, add_generation_prompt)
    variables = {
        "messages": msgs,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
        **dict(extra or {}),
    }
    text = renderer().render(template, variables)
    starts_with_bos = bool(bos_token) and text.startswith(bos_token)
    return RenderedPrompt(text, add_special=not starts_with_bos, template_source="gguf")


def renderer() -> Any:
    """The process-wide TemplateProcess that renders every model template under the budget above."""
    return shared(TEMPLATE_TIME_LIMIT_S, TEMPLATE_MEMORY_BYTES, MAX_PROMPT_CHARS)


def _render_fallback(msgs: list[dict[str, Any]], add_generation_prompt: bool) -> RenderedPrompt:
    parts = []
    for m in msgs:
        if m["role"] == "system":
            parts.append(f"{m['content']}\n\n")
        else:
            speaker = "User" if m["role"] in ("user", "tool") else "Assistant"
            parts.append(f"{speaker}: {m['content']}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return RenderedPrompt("".join(parts), add_special=True, template_source=FALLBACK_NAME, stop=FALLBACK_STOP)


def render_for_spec(
    spec: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    template_override: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """Render with a ModelSpec's template and special tokens (the common path for backends' callers).
    `extra`: more template variables (`tools=` for a template that renders tools, backends/tools/render.py)."""
    template = template_override if template_override is not None else spec.chat_template
    rendered = render_chat(
        messages,
        template=template,
        bos_token=spec.bos_token_text or "",
        eos_token=spec.eos_token_text or "",
        add_generation_prompt=add_generation_prompt,
        extra=extra,
    )
    if template_override is not None and template is not None:
        return RenderedPrompt(rendered.text, rendered.add_special, "custom", rendered.stop)
    return rendered
