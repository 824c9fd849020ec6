"""Request bodies from the wire to a JSON object: a 413 for a body larger than the limit, a 400 for one that
would cost more than its size.  Both APIs read their bodies here; each validates the fields its own way
afterwards (pydantic: app/server/inputs.py for OpenAI's, app/server/ollama_requests.py for Ollama's).

`read_body` gathers the bytes on the event loop and stops at the limit (a chunked body has no Content-Length for
app.py's guard to check first).  `decode_body` runs on a worker thread (the caller's `run_in_threadpool`), never
on the event loop.  Its checks, in order: the bytes are UTF-8 JSON (json.loads); the nesting is at most
`max_depth` arrays/objects deep (deeper bodies either exhaust Python's recursion inside json.loads, a
RecursionError, or are found by an iterative walk); no string holds a lone UTF-16 surrogate (JSON's `\\ud800`
escape decodes to one, and it cannot be encoded back to UTF-8 for the tokenizer); a chat body has at most
`max_messages` messages.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request as HTTPRequest

from app.server.errors import APIError

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")  # \ud800..\udfff written as a JSON escape


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="body_too_large")


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """The body's bytes; APIError(413) as soon as more than `limit` have come (the rest is never read)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(raw: bytes, max_depth: int, max_messages: int | None) -> dict[str, Any]:
    """The body as a dict; APIError(400) naming the limit when it is not acceptable."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(data).__name__}")
    if _depth(data, max_depth) > max_depth:
        raise _too_deep(max_depth)
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(data)
        if where is not None:
            raise APIError(
                400,
                f"{where or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is not text; send valid Unicode",
                param=where or None,
                code="invalid_unicode",
            )
    messages = data.get("messages")
    if max_messages is not None and isinstance(messages, list) and len(messages) > max_messages:
        raise APIError(
            400,
            f"the conversation has {len(messages)} messages; this server takes at most "
            f"{max_messages} per request (drop or summarise older turns)",
            param="messages",
            code="too_many_messages",
        )
    return data


def _too_deep(max_depth: int) -> APIError:
    return APIError(
        400, f"the body nests arrays/objects more than {max_depth} levels deep (the limit)", code="too_deep"
    )


def _depth(data: Any, limit: int) -> int:
    """How deep `data` nests, walking iteratively (no recursion); stops counting past `limit`."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _lone_surrogate(data: Any) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate; "" for the top level; None if
    there is none (the escape seen in the bytes was itself escaped, `\\\\ud800`)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                sub = f"{path}.{key}" if path else str(key)
                if not _encodes(key):
                    return path
                stack.append((item, sub))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
