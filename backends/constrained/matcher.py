"""One constrained request's grammar state: which tokens may come next, and advancing on the token chosen.

The mask is llguidance's bitmask: int32 words, bit `t % 32` of word `t // 32` set when token t is allowed
(little-endian bit order, so a uint8 view unpacks with numpy's bitorder="little").  At the end of the grammar
(prefix, JSON, suffix) only the end-of-sequence tokens are allowed, so a constrained stream ends with STOP.

Used by one thread at a time (the torch engine's thread; the llama.cpp backend's worker), never concurrently.
"""

from __future__ import annotations

import re
from typing import Any

from backends.errors import InvalidRequestError


class ConstraintViolation(InvalidRequestError):
    """The grammar refused a token: that request alone fails."""


class ConstraintLimitError(ConstraintViolation):
    """llguidance stopped the grammar on one of its per-step limits (Earley items, lexer states or fuel) in the
    middle of a reply: that request alone ends, with FinishReason.ERROR, `error_code` "constraint_limit" on its
    FINISHED event and a message naming the limit; the other requests of the batch go on."""

    error_code = "constraint_limit"


# llguidance reports every stop as stop_reason "InternalError" here (1.9), so its limit errors are told apart by
# their text: these are the messages of ParserLimits' checks (parser/src/earley/parser.rs, lexer.rs).
_LIMITS = (
    (re.compile(r"Too many items \(limit (\d+)"), "step_max_items: at most {} parser items in one step"),
    (re.compile(r"Current row has \d+ items; max is (\d+)"), "max_items_in_row: at most {} parser items in a row"),
    (
        re.compile(r"(?i)lexer (?:error|too complex)|fuel exhausted|max_lexer_states|lexer_fuel"),
        "the lexer's max_lexer_states / step_lexer_fuel",
    ),
)


class Matcher:
    def __init__(self, ll: Any, vocab_size: int, model_vocab_size: int) -> None:
        self._ll = ll  # llguidance.LLMatcher
        self.vocab_size = vocab_size  # tokens llguidance knows
        self.model_vocab_size = model_vocab_size  # the logits' width; ids >= vocab_size are never allowed
        self.num_words = (vocab_size + 31) // 32  # int32 words in one row of the bitmask
        self.num_tokens = 0  # tokens accepted so far (named in a limit's message)

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (num_words int32 words) at `address` (a contiguous CPU buffer)."""
        self._check()
        if num_bytes != self.num_words * 4:
            raise ValueError(f"the bitmask row is {num_bytes} bytes, expected {self.num_words * 4}")
        self._ll.unsafe_compute_mask_ptr(address, num_bytes)
        self._check()

    def allowed(self) -> Any:
        """The allowed tokens as a numpy bool array of model_vocab_size (for tests and the llama.cpp backend)."""
        import numpy as np  # lazy: heavy: numpy

        words = np.zeros(self.num_words, dtype=np.int32)
        self.fill_bitmask(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
        out = np.zeros(self.model_vocab_size, dtype=bool)
        n = min(self.vocab_size, self.model_vocab_size)
        out[:n] = bits[:n]
        return out

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token; raises ConstraintViolation when the grammar does not allow it."""
        if not self._ll.consume_token(int(token_id)) or self._ll.is_error():
            self._raise_limit()
            raise ConstraintViolation(f"token {token_id} breaks the constraint: {self._error()}")
        self.num_tokens += 1

    @property
    def is_finished(self) -> bool:
        """The grammar is complete (only end-of-sequence may follow, or it was consumed)."""
        return bool(self._ll.is_stopped() or self._ll.is_accepting())

    def _check(self) -> None:
        if self._ll.is_error():
            self._raise_limit()
            raise ConstraintViolation(f"the constraint failed: {self._error()}")

    def _raise_limit(self) -> None:
        """ConstraintLimitError, naming the limit, when the grammar's error is one of llguidance's limits."""
        text, reason = self._error(), self._ll.stop_reason()
        limit = next((name.format(*m.groups()) for pattern, name in _LIMITS if (m := pattern.search(text))), None)
        if limit is None and reason in ("ParserTooComplex", "LexerTooComplex"):
            limit = reason
        if limit is not None:
            raise ConstraintLimitError(
                f"the constraint hit llguidance's limit {limit}, after {self.num_tokens} constrained tokens ({text})",
                "simplify the schema where the reply stopped (fewer alternatives or shallower nesting there)",
            )

    def _error(self) -> str:
        text = str(self._ll.get_error()).replace("<non-verbose/>", "")
        return " ".join(text.split())[:300] or "no error text"
