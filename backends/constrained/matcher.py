"""One constrained request's grammar state: which tokens may come next, and advancing on the token chosen.

The mask is llguidance's bitmask: int32 words, bit `t % 32` of word `t // 32` set when token t is allowed
(little-endian bit order, so a uint8 view unpacks with numpy's bitorder="little").  At the end of the grammar
(prefix, JSON, suffix) only the end-of-sequence tokens are allowed, so a constrained stream ends with STOP.

Used by one thread at a time (the torch engine's thread; the llama.cpp backend's worker), never concurrently.
"""

from __future__ import annotations

from typing import Any

from backends.errors import InvalidRequestError


class ConstraintViolation(InvalidRequestError):
    """The grammar refused a token or ran out of its step budget: that request alone fails."""


class Matcher:
    def __init__(self, ll: Any, vocab_size: int, model_vocab_size: int) -> None:
        self._ll = ll  # llguidance.LLMatcher
        self.vocab_size = vocab_size  # tokens llguidance knows
        self.model_vocab_size = model_vocab_size  # the logits' width; ids >= vocab_size are never allowed
        self.num_words = (vocab_size + 31) // 32  # int32 words in one row of the bitmask

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        """Write the allowed-token bitmask (num_words int32 words) at `address` (a contiguous CPU buffer)."""
        self._check()
        if num_bytes != self.num_words * 4:
            raise ValueError(f"the bitmask row is {num_bytes} bytes, expected {self.num_words * 4}")
        self._ll.unsafe_compute_mask_ptr(address, num_bytes)
        self._check()

    def allowed(self) -> Any:
        """The allowed tokens as a numpy bool array of model_vocab_size (for tests and the llama.cpp backend)."""
        import numpy as np

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
            raise ConstraintViolation(f"token {token_id} breaks the constraint: {self._error()}")

    @property
    def is_finished(self) -> bool:
        """The grammar is complete (only end-of-sequence may follow, or it was consumed)."""
        return bool(self._ll.is_stopped() or self._ll.is_accepting())

    def _check(self) -> None:
        if self._ll.is_error():
            raise ConstraintViolation(f"the constraint failed: {self._error()}")

    def _error(self) -> str:
        return " ".join(str(self._ll.get_error()).split())[:300] or "no error text"
