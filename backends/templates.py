"""Chat templates: a conversation becomes prompt text with the model's own `tokenizer.chat_template`.

The template comes from the model file, so it is untrusted input: it renders only in Jinja's
ImmutableSandboxedEnvironment, tightened so that touching an unsafe attribute (`''.__class__.__mro__`) raises
at once instead of quietly rendering as empty.  The same code serves every backend.

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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from backends.errors import TemplateError

ROLES = ("system", "user", "assistant", "tool")
FALLBACK_NAME = "hearth-plain"  # what template_source says when the fallback format was used
FALLBACK_STOP = ("\nUser:",)
MAX_PROMPT_CHARS = 8_000_000  # far beyond any context; a template writing more is broken or hostile


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # the prompt text, special tokens written as text (tokenize with parse_special)
    add_special: bool  # False when the template already wrote the BOS token itself
    template_source: str  # "gguf" (the model's own) | "hearth-plain" (fallback) | "custom"
    stop: tuple[str, ...] = ()  # extra stop strings the format needs


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class _StrictSandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                         extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"the model's chat template does not parse (line {exc.lineno}: {exc.message})",
                            "pass a template of your own, or use a fixed GGUF") from None


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate a conversation: a non-empty list of {role, content} with known roles and string content."""
    from backends.errors import InvalidRequestError

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


def render_chat(messages: Sequence[Mapping[str, Any]], *, template: str | None, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True,
                extra: Mapping[str, Any] | None = None) -> RenderedPrompt:
    """Render `messages` with `template` (the model's) or, when None, the documented fallback."""
    msgs = check_messages(messages)
    if template is None:
        return _render_fallback(msgs, add_generation_prompt)
    from jinja2.exceptions import TemplateError as JinjaTemplateError
    from jinja2.sandbox import SecurityError

    compiled = _compile(template)
    try:
        chunks, size = [], 0
        for chunk in compiled.generate(messages=msgs, add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, **dict(extra or {})):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise TemplateError(f"the model's chat template produced more than {MAX_PROMPT_CHARS:,} "
                                    "characters; refused", "this GGUF's template is broken or hostile")
            chunks.append(chunk)
        text = "".join(chunks)
    except SecurityError as exc:
        raise TemplateError(f"the model's chat template tried to reach Python internals ({exc}); refused",
                            "this GGUF's template is unsafe: use another file or a custom template") from None
    except TemplateError:
        raise
    except (JinjaTemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError,
            RecursionError) as exc:
        raise TemplateError(f"the model's chat template failed: {type(exc).__name__}: {exc}",
                            "the template may not support this conversation (e.g. a system message)") from None
    starts_with_bos = bool(bos_token) and text.startswith(bos_token)
    return RenderedPrompt(text, add_special=not starts_with_bos, template_source="gguf")


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


def render_for_spec(spec: Any, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    template_override: str | None = None) -> RenderedPrompt:
    """Render with a ModelSpec's template and special tokens (the common path for backends' callers)."""
    template = template_override if template_override is not None else spec.chat_template
    rendered = render_chat(messages, template=template, bos_token=spec.bos_token_text or "",
                           eos_token=spec.eos_token_text or "", add_generation_prompt=add_generation_prompt)
    if template_override is not None and template is not None:
        return RenderedPrompt(rendered.text, rendered.add_special, "custom", rendered.stop)
    return rendered
