"""The chat-template render worker: a small child process that renders untrusted Jinja templates.

Run as a script (`python template_worker.py MEMORY_BYTES MAX_CHARS`) by `backends.template_process`; it imports
only the standard library and jinja2 (not hearth), so it starts in tens of milliseconds whatever the parent
has loaded.  Protocol, one JSON object per line each way (ASCII-only JSON, so a line never holds a raw newline):

    parent -> worker   {"template": SOURCE, "vars": {...}}
    worker -> parent   {"ok": true, "text": TEXT} | {"ok": false, "kind": KIND, "message": ONE_LINE}

KIND is "syntax" (the template does not parse), "security" (it reached for Python internals), "raise" (the
template's own raise_exception), "output" (it wrote more than MAX_CHARS), "memory" (it went over the
address-space limit) or "failed" (any other error while rendering).  The wall-clock limit is the parent's: it
kills this process when a reply is late, which stops even a single C-level call (a huge `**`, a long
`str.format` width) that no hook inside Python could interrupt.  If hearth itself dies in the middle of a
render, a watch thread sees the parent change and exits, so no template spins on as an orphan.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# Run as a script, Python put this file's folder (backends/) first on sys.path: drop it, so no hearth module
# there can shadow a standard one.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import json  # noqa: E402
from datetime import datetime  # noqa: E402
from functools import lru_cache  # noqa: E402
from typing import Any  # noqa: E402

MAX_LIPSUM_WORDS = 10_000  # lipsum(n, min, max) may write at most this many words


class _Refusal(Exception):
    """A budget or template refusal with its KIND for the reply."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _raise(message: Any) -> None:
    raise _Refusal("raise", f"the chat template refused the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _make_env() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError  # lazy: heavy: jinja2
    from jinja2.utils import generate_lorem_ipsum  # lazy: heavy: jinja2

    class StrictSandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        if not all(isinstance(v, int) for v in (n, min, max)) or n * max > MAX_LIPSUM_WORDS:
            raise _Refusal(
                "output",
                f"the chat template called lipsum(n={n!r}, max={max!r}), over the budget of "
                f"{MAX_LIPSUM_WORDS:,} words (n * max); refused",
            )
        return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))

    env = StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["lipsum"] = lipsum
    return env


_ENV: Any = None


@lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    import jinja2  # lazy: heavy: jinja2

    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise _Refusal("syntax", f"the chat template does not parse (line {exc.lineno}: {exc.message})") from None


def _render(source: str, variables: dict[str, Any], max_chars: int) -> str:
    from jinja2.sandbox import SecurityError  # lazy: heavy: jinja2

    template = _compile(source)
    chunks, size = [], 0
    try:
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > max_chars:
                raise _Refusal(
                    "output", f"the chat template wrote more than {max_chars:,} characters (the output budget); refused"
                )
            chunks.append(chunk)
    except SecurityError as exc:
        raise _Refusal("security", f"the chat template tried to reach Python internals ({exc}); refused") from None
    return "".join(chunks)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def handle(line: bytes, max_chars: int, memory_bytes: int) -> dict[str, Any]:
    try:
        request = json.loads(line)
        return {"ok": True, "text": _render(request["template"], request["vars"], max_chars)}
    except _Refusal as exc:
        return {"ok": False, "kind": exc.kind, "message": _one_line(str(exc))}
    except MemoryError:
        return {
            "ok": False,
            "kind": "memory",
            "message": f"the chat template needed more than "
            f"{memory_bytes // 2**20} MiB of memory (the memory budget); refused",
        }
    except RecursionError:
        return {"ok": False, "kind": "failed", "message": "the chat template failed: it recursed too deeply"}
    except Exception as exc:  # noqa: BLE001 - the template is untrusted: every failure becomes a reply
        return {
            "ok": False,
            "kind": "failed",
            "message": _one_line(f"the chat template failed: {type(exc).__name__}: {exc}"),
        }


def _limit_memory(extra_bytes: int) -> None:
    """Cap this process's address space at what it uses now (interpreter + jinja2) plus `extra_bytes`."""
    try:
        import resource  # lazy: optional dependency (ImportError handled)

        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (now + extra_bytes, now + extra_bytes))
    except (ImportError, OSError, ValueError):  # not Linux: the time limit and the output budget still hold
        pass


def _exit_with_parent() -> None:
    """If hearth dies while a template spins here, stdin's EOF is never read: notice the new parent instead."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    global _ENV
    memory_bytes, max_chars = int(argv[1]), int(argv[2])
    _exit_with_parent()  # before the memory limit: the thread's stack is reserved now
    _ENV = _make_env()
    _compile("{{ x }}")  # warm jinja's compiler before the limit, so its first use is not counted
    _limit_memory(memory_bytes)
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        reply = handle(line, max_chars, memory_bytes)
        try:
            data = json.dumps(reply).encode("ascii") + b"\n"
        except MemoryError:
            reply = {
                "ok": False,
                "kind": "memory",
                "message": "the chat template's output did not fit the "
                f"memory budget ({memory_bytes // 2**20} MiB); refused",
            }
            data = json.dumps(reply).encode("ascii") + b"\n"
        del reply
        out.write(data)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
