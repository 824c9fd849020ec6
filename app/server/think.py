"""A reply's reasoning split from its answer: a reply that starts with <think>...</think> (Qwen3 and the models
that copy it) as (thinking, content) pieces, fed as the tokens arrive.  Ollama's `message.thinking` (and
/api/generate's `thinking`) is the first part; app/server/ollama_answers.py writes it.

Moved out of app/server/ollama.py, which re-exports it as `_Think` (the unit tests reach it there).
"""

from __future__ import annotations


class ThinkSplitter:
    """Splits a reply that starts with <think>...</think> into thinking and content (Ollama's message.thinking).
    The pieces it returns concatenate to the same text however the reply was cut."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, on: bool) -> None:
        self.state = "start" if on else "content"
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, content) of the next piece."""
        if self.state == "after":  # the blank lines between </think> and the answer are not the answer's
            text = text.lstrip("\n")
            if not text:
                return "", ""
            self.state = "content"
        if self.state == "content":
            return "", text
        self.buf += text
        thinking = content = ""
        if self.state == "start":
            stripped = self.buf.lstrip()
            if self.OPEN.startswith(stripped):  # may still become <think>
                return "", ""
            if not stripped.startswith(self.OPEN):
                self.state, content, self.buf = "content", self.buf, ""
                return "", content
            self.state, self.buf = "thinking", stripped[len(self.OPEN) :]
        if self.state == "thinking":
            at = self.buf.find(self.CLOSE)
            if at >= 0:
                thinking, rest = self.buf[:at], self.buf[at + len(self.CLOSE) :]
                self.state, self.buf = "after", ""
                return thinking, self.feed(rest)[1] if rest else ""
            keep = max((k for k in range(1, len(self.CLOSE)) if self.buf.endswith(self.CLOSE[:k])), default=0)
            thinking, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        return thinking, content

    def flush(self) -> tuple[str, str]:
        """(thinking, content) held back at the reply's end: a think block never closed is all thinking."""
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "thinking" else ("", rest.lstrip("\n") if self.state == "after" else rest)
