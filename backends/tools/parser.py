"""ToolCallParser: a reply's text, piece by piece, split into plain text and tool-call deltas.

Feed it the TOKEN texts of a stream; it returns what is safe to show now:

- `TextDelta(text)`: reply text that is not a call.  Text that may be the start of a call marker is held back
  until it is known not to be one; so are trailing blanks (dropped when a call follows them, so a reply that
  is only calls has no content, as OpenAI returns it).
- `CallDelta(index, id, name, arguments)`: a piece of the call number `index`, in the order OpenAI streams
  them: the first piece of a call carries its id and name (and arguments ""), the next ones arguments text.
  The arguments pieces of a call concatenate to its arguments JSON text.

`finish()` ends the reply: held text is released (a marker that never became a call is text after all) and a
call cut off by max_tokens keeps the arguments written so far.  `parse_reply` runs it over a whole reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from backends.api import ToolCall
from backends.tools.base import ToolFormat
from backends.tools.scan import scan_region


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallDelta:
    index: int  # which call of the reply (0, 1, ...)
    arguments: str = ""  # the next piece of the arguments JSON text
    id: str | None = None  # first piece only
    name: str | None = None  # first piece only


Delta = TextDelta | CallDelta


@dataclass
class _Region:
    marker: str  # the text that opened it ("<tool_call>", or blanks before bare JSON)
    bare: bool  # opened without a marker (the reply started with JSON)
    body: str = ""
    first_call: int = 0  # the reply-wide index of this region's first call
    emitted: list[int] = field(default_factory=list)  # arguments characters emitted, per call of the region
    memo: dict = field(default_factory=dict)  # scan_region's state on this body (it only grows)


class ToolCallParser:
    def __init__(
        self,
        fmt: ToolFormat,
        *,
        max_calls: int | None = None,
        forced: bool = False,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        """`max_calls`: calls after this many are dropped (parallel_tool_calls false); `forced`: the reply is
        a call (a forced tool_choice), so it may start with the call JSON without its marker."""
        self.format = fmt
        self.max_calls = max_calls
        self._bare = fmt.bare_starts + ("{[" if forced else "")
        self._new_id = new_id or fmt.new_call_id
        self._pending = ""  # text not yet shown
        self._region: _Region | None = None
        self._shown_text = False  # non-blank text shown already (a bare call can no longer start)
        self.calls: list[ToolCall] = []  # complete or cut-off calls so far: id, name, arguments so far
        self.text = ""  # all text shown so far

    # -- public --------------------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        if self._region is not None:
            self._region.body += text
            self._step_region(out, final=False)
        else:
            self._pending += text
            self._step_text(out, final=False)
        return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._region is not None:
            self._step_region(out, final=True)
        if self._region is None:
            self._step_text(out, final=True)
        return out

    # -- text ----------------------------------------------------------------------------------------------
    def _step_text(self, out: list[Delta], final: bool) -> None:
        pending = self._pending
        stripped = pending.lstrip()
        if self._bare and not self._shown_text and not self.calls and stripped and stripped[0] in self._bare:
            self._pending = ""
            self._open(out, marker=pending[: len(pending) - len(stripped)], bare=True, body=stripped, final=final)
            return
        found = [(pending.find(m), m) for m in self.format.starts if m in pending]
        if found:
            at, marker = min(found)
            before = pending[:at].rstrip()
            self._show(out, before, drop_blank=True)
            self._pending = ""
            # the blanks before the marker go with it: text again if no call comes of it
            self._open(
                out,
                marker=pending[len(before) : at] + marker,
                bare=False,
                body=pending[at + len(marker) :],
                final=final,
            )
            return
        if final:
            self._pending = ""
            self._show(out, pending, drop_blank=bool(self.calls))
            return
        if not stripped:
            return  # blank: held (dropped if a call follows)
        # hold a tail that may start a marker, and the blanks before it (dropped if a call follows)
        keep = _partial_marker(pending, self.format.starts)
        head = pending[: len(pending) - keep].rstrip()
        if head:
            self._show(out, head)
            self._pending = pending[len(head) :]

    def _show(self, out: list[Delta], text: str, drop_blank: bool = False) -> None:
        if not text or (drop_blank and not text.strip()):
            return
        self.text += text
        self._shown_text = self._shown_text or bool(text.strip())
        out.append(TextDelta(text))

    # -- regions -------------------------------------------------------------------------------------------
    def _open(self, out: list[Delta], marker: str, bare: bool, body: str, final: bool) -> None:
        self._region = _Region(marker, bare, body, first_call=len(self.calls))
        self._step_region(out, final)

    def _step_region(self, out: list[Delta], final: bool) -> None:
        region = self._region
        assert region is not None
        scan = scan_region(region.body, self.format.end, final, region.memo)
        for i, call in enumerate(scan.calls):
            self._emit_call(out, region, i, call.name, call.arguments)
        rest = region.body[scan.at :]
        if scan.status == "closed" or (final and scan.status == "open"):
            self._region = None
            self._pending = rest if scan.status == "closed" else ""
            self._step_text(out, final)
        elif scan.status == "invalid" or (final and scan.status == "undecided"):
            # not a call after all: the region's unread text (with its marker when no call came of it) is text
            self._region = None
            if region.emitted or region.bare:
                self._pending = rest if region.emitted else region.marker + region.body
                if region.bare and not region.emitted:
                    self._bare = ""  # the reply started as text: it cannot become a bare call any more
                self._step_text(out, final)
            else:  # show the marker's first character (and blanks before it): it cannot open a region again
                text = region.marker + region.body
                cut = len(text) - len(text.lstrip()) + 1
                self._show(out, text[:cut])
                self._pending = text[cut:]
                self._step_text(out, final)

    def _emit_call(self, out: list[Delta], region: _Region, i: int, name: str, arguments: str) -> None:
        index = region.first_call + i
        if self.max_calls is not None and index >= self.max_calls:
            if i >= len(region.emitted):
                region.emitted.append(0)
            return
        if i >= len(region.emitted):
            region.emitted.append(0)
            call_id = self._new_id()
            self.calls.append(ToolCall(call_id, name, ""))
            out.append(CallDelta(index, "", id=call_id, name=name))
        done = region.emitted[i]
        if len(arguments) > done:
            piece = arguments[done:]
            region.emitted[i] = len(arguments)
            old = self.calls[index]
            self.calls[index] = ToolCall(old.id, old.name, old.arguments + piece)
            out.append(CallDelta(index, piece))


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a marker (held back: may become one)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                best = max(best, k)
                break
    return best


def parse_reply(
    fmt: ToolFormat, text: str, *, max_calls: int | None = None, forced: bool = False
) -> tuple[str, list[ToolCall]]:
    """A whole reply as (content text, calls)."""
    parser = ToolCallParser(fmt, max_calls=max_calls, forced=forced)
    parser.feed(text)
    parser.finish()
    return parser.text, list(parser.calls)
