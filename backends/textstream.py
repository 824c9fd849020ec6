"""Incremental detokenization with stop strings, shared by every backend.

Two things make streaming text tricky:
- a UTF-8 character can be split across tokens (byte-fallback tokens, byte-level BPE), so text is decoded from
  bytes with an incremental decoder that holds back an incomplete character;
- a stop string can be split across tokens ("<|im" + "_end|>"), so any tail of the text that could still
  become a stop string is held back until the next token settles it.  The stop string itself is never shown.

`TextStream(token_bytes, stop)`: `token_bytes(ids) -> bytes` gives the raw bytes of tokens (llama.cpp's
token_to_piece, or the byte-level map of a `tokenizers` vocabulary).  `push(ids)` returns the text that is
safe to show now and whether a stop string was hit; `flush()` returns what is still held at the end.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, token_bytes: Callable[[Sequence[int]], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._stop = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet shown (could start a stop string)
        self.text = ""  # everything shown so far
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Add generated tokens; return (text safe to show now, whether a stop string ended the reply)."""
        if self.stopped:
            return "", True
        self._held += self._decoder.decode(self._token_bytes(token_ids))
        if not self._stop:
            out, self._held = self._held, ""
            self.text += out
            return out, False
        # A stop string anywhere in the held text ends the reply there.
        cut = min((i for i in (self._held.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            out = self._held[:cut]
            self._held = ""
            self.stopped = True
            self.text += out
            return out, True
        keep = self._longest_partial_stop(self._held)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        self.text += out
        return out, False

    def flush(self) -> str:
        """End of generation: release what was held back (it did not become a stop string)."""
        if self.stopped:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        self.text += out
        return out

    def _longest_partial_stop(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
