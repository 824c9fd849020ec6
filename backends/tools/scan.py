"""Reading the calls in a call region (the text after a start marker), however much of it has arrived.

`scan_region(body, end, final)` is a pure function of the text so far: it returns the calls it can see (each
with the arguments text written so far) and where the region stands.  The incremental parser (parser.py) runs
it again on every new piece and emits only the difference, so streaming and non-streaming read a reply the
same way by construction.  What it returns only grows as text is appended (the arguments of a call grow by
suffixes; a call's name is known at once, whole), which is what makes that difference well defined.

A region holds call objects separated by blanks, `,` or `;`, optionally inside `[ ... ]`.  A call object is
`{"name": "...", "arguments" | "parameters": VALUE, ...}`.  When it starts with the name (what every family
writes, and what the constraint forces), the name is known as soon as it is complete and the arguments are
streamed as they arrive; an object with its keys in another order is read when it is complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

ARGS_KEYS = ("arguments", "parameters")
_SEPARATORS = " \t\r\n,;[]"


@dataclass
class CallScan:
    name: str
    arguments: str  # the arguments JSON text so far (complete when `complete`)
    complete: bool


@dataclass
class RegionScan:
    calls: list[CallScan] = field(default_factory=list)
    # "open": more may come; "closed": the end marker was read (text resumes at `at`); "invalid": the text at
    # `at` is not a call (it is plain text); "undecided": an object starts at `at` but is not known to be a call
    status: str = "open"
    at: int = 0


def scan_region(body: str, end: str | None, final: bool = False, memo: dict | None = None) -> RegionScan:
    """`memo`: a dict kept by the caller across calls on the same growing `body` (the scanner's state per
    JSON value, so each character is scanned once however often the region is read again); None = no reuse."""
    memo = {} if memo is None else memo
    out = RegionScan()
    pos = 0
    n = len(body)
    while True:
        while pos < n and body[pos] in _SEPARATORS:
            pos += 1
        if pos == n:
            out.status, out.at = "open", pos
            return out
        if end is not None:
            if body.startswith(end, pos):
                out.status, out.at = "closed", pos + len(end)
                return out
            if end.startswith(body[pos:]):  # maybe the start of the end marker
                out.status, out.at = "open", pos
                return out
        if body[pos] != "{":
            out.status, out.at = "invalid", pos
            return out
        call, after, state = _scan_object(body, pos, memo)
        if state == "not_a_call":
            out.status, out.at = "invalid", pos
            return out
        if call is None:  # not yet known whether it is a call
            out.status, out.at = "undecided", pos
            return out
        out.calls.append(call)
        if not call.complete:
            out.status, out.at = "open", pos
            return out
        pos = after


def _scan_object(body: str, start: int, memo: dict) -> tuple[CallScan | None, int, str]:
    """(call or None, index after the object, "call" | "not_a_call" | "partial")."""
    obj_end = _value_end(body, start, memo=memo)
    header = _header(body, start)
    if header is not None and header != "fail":
        name, args_start = header
        args = _arguments_so_far(body, args_start, obj_end, memo)
        return CallScan(name, args, obj_end is not None), obj_end or len(body), "call"
    if obj_end is None:
        return None, len(body), "partial"
    try:
        obj = json.loads(body[start:obj_end])
    except ValueError:
        return None, obj_end, "not_a_call"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, obj_end, "not_a_call"
    value = next((obj[k] for k in ARGS_KEYS if k in obj), {})
    args = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return CallScan(obj["name"], args, True), obj_end, "call"


def _header(body: str, start: int) -> tuple[str, int] | str | None:
    """`{"name": "NAME", "arguments":` at `start`: (NAME, index after the colon), None when the text so far is
    a prefix of one, "fail" when it cannot be one."""
    n = len(body)
    i = start + 1  # past "{"

    def skip(i: int) -> int:
        while i < n and body[i].isspace():
            i += 1
        return i

    def literal(i: int, options: tuple[str, ...]) -> int | None | str:
        for s in options:
            piece = body[i : i + len(s)]
            if piece == s:
                return i + len(s)
        if any(s.startswith(body[i : i + len(s)]) for s in options if n - i < len(s)):
            return None
        return "fail"

    i = skip(i)
    step = literal(i, ('"name"',))
    if not isinstance(step, int):
        return step
    i = skip(step)
    step = literal(i, (":",))
    if not isinstance(step, int):
        return step
    i = skip(step)
    if i == n:
        return None
    if body[i] != '"':
        return "fail"
    j = i + 1
    while j < n and body[j] != '"':
        j += 2 if body[j] == "\\" else 1
    if j >= n:
        return None
    try:
        name = json.loads(body[i : j + 1])
    except ValueError:
        return "fail"
    i = skip(j + 1)
    step = literal(i, (",",))
    if not isinstance(step, int):
        return step
    i = skip(step)
    step = literal(i, tuple(f'"{k}"' for k in ARGS_KEYS))
    if not isinstance(step, int):
        return step
    i = skip(step)
    step = literal(i, (":",))
    if not isinstance(step, int):
        return step
    return name, step


def _arguments_so_far(body: str, start: int, obj_end: int | None, memo: dict) -> str:
    """The arguments value's text from `start` (after the colon): up to its last non-blank character so far.
    A value written as a JSON string (some models quote the arguments) counts only once complete, decoded."""
    n = len(body) if obj_end is None else obj_end
    i = start
    while i < n and body[i].isspace():
        i += 1
    if i == n:
        return ""
    end = _value_end(body, i, stop_at=n, memo=memo)
    if body[i] == '"':
        if end is None:
            return ""
        try:
            text = json.loads(body[i:end])
        except ValueError:
            return body[i:end]
        return text if isinstance(text, str) else body[i:end]
    if end is not None:
        return body[i:end]
    return body[i:n].rstrip()


def _value_end(body: str, start: int, stop_at: int | None = None, memo: dict | None = None) -> int | None:
    """The index just after the JSON value starting at `start`, None when it is not complete yet.  Objects,
    arrays and strings end at their closing character; a scalar (number, true, null) at the next `,` `}` `]`
    or blank.  `memo[start]` keeps where the scan got to (text is only ever appended), so it resumes there."""
    n = len(body) if stop_at is None else stop_at
    first = body[start]
    if first not in '{["':
        i = start
        while i < n and body[i] not in ",}] \t\r\n":
            i += 1
        return i if i < n else None
    i, depth, in_string = memo.get(start, (start, 0, False)) if memo is not None else (start, 0, False)
    if depth < 0:  # finished before: i is the end
        return i
    end = None
    while i < n:
        c = body[i]
        if in_string:
            if c == "\\":
                if i + 1 >= n:
                    break  # the escaped character has not arrived: resume on the backslash
                i += 1
            elif c == '"':
                in_string = False
                if depth == 0:
                    end = i + 1
                    break
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                end = i + 1
                break
        i += 1
    if memo is not None:
        memo[start] = (end, -1, False) if end is not None else (i, depth, in_string)
    return end
