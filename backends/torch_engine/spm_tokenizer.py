"""SentencePiece-style tokenizer for GGUF "llama" vocabularies (Llama 1/2, Mistral, TinyLlama, ...), with the
same ids as llama.cpp's (its llm_tokenizer_spm), built from the GGUF's tokens, scores and token types.

What llama.cpp does, and so this:
- Special tokens are cut out of the text first, longest first, and never merged across: user-defined ones
  always, control ones when parse_special is on.
- Each remaining text fragment gets a leading space when it starts the text or follows a special token
  (`tokenizer.ggml.add_space_prefix`, default true), then every space becomes "▁".
- The fragment starts as one symbol per UTF-8 character; repeatedly the adjacent pair whose concatenation is
  a vocabulary token with the highest score is merged (ties: the leftmost pair).
- Every merge makes a vocabulary token, so a final symbol that is none is a single character: it becomes its
  UTF-8 bytes as "<0xXX>" byte tokens (byte fallback), else the unknown token.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # "▁"


class SpmTokenizer:
    """encode(text, add_special, parse_special) -> ids; decode(ids) -> text; token_bytes(ids) -> reply bytes
    (the HearthTokenizer interface)."""

    def __init__(
        self,
        tokens: Sequence[str],
        scores: Sequence[float],
        types: Sequence[int],
        bos_id: int | None,
        eos_id: int | None,
        unk_id: int | None,
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool = True,
    ) -> None:
        self.tokens = list(tokens)
        self.scores = list(scores) if scores else [0.0] * len(tokens)
        self.types = list(types) if types else [NORMAL] * len(tokens)
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self._ids = {}
        for i, t in enumerate(self.tokens):
            self._ids.setdefault(t, i)
        self._bytes_ids = [self._ids.get(f"<0x{b:02X}>") for b in range(256)]
        special = [i for i, k in enumerate(self.types) if k in (CONTROL, USER_DEFINED)]
        self._special = sorted(special, key=lambda i: (-len(self.tokens[i]), i))  # longest first
        self._bytes = [self._piece_bytes(i) for i in range(len(self.tokens))]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # -- encoding ----------------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        prev_special = True  # a space prefix goes on the first fragment and on each one after a special token
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                fragment = " " + fragment
            ids.extend(self._encode_fragment(fragment.replace(" ", SPACE)))
            prev_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        parts: list[str | int] = [text] if text else []
        for tid in self._special:
            piece = self.tokens[tid]
            if not piece or (not parse_special and self.types[tid] == CONTROL):
                continue  # user-defined tokens are matched even then (as in llama.cpp)
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    out.append(part)
                    continue
                chunks = part.split(piece)
                for k, chunk in enumerate(chunks):
                    if k:
                        out.append(tid)
                    if chunk:
                        out.append(chunk)
            parts = out
        return parts

    def _encode_fragment(self, text: str) -> list[int]:
        if not text:
            return []
        n = len(text)  # one symbol per character to start with (llama.cpp walks UTF-8 characters)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        size = [1] * n  # characters of symbol i, which starts at character i; 0 once merged into its left

        heap: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            length = size[left] + size[right]
            tid = self._ids.get(text[left : left + length])
            if tid is not None:  # max-heap by score, ties to the leftmost pair (llm_bigram_spm's order)
                heapq.heappush(heap, (-self.scores[tid], left, right, length))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue  # stale: one side was merged since
            size[left] = length
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] != -1:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        out: list[int] = []
        i = 0
        while i != -1:
            # every merge made a vocabulary token, so a symbol that is none is one character: its bytes
            piece = text[i : i + size[i]]
            tid = self._ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                for b in piece.encode("utf-8"):
                    bid = self._bytes_ids[b]
                    if bid is None:
                        bid = self._ids.get(chr(b), self.unk_id)
                    if bid is not None:
                        out.append(bid)
            i = nxt[i]
        return out

    # -- decoding ----------------------------------------------------------------------------------------
    def _piece_bytes(self, i: int) -> bytes:
        kind, tok = self.types[i], self.tokens[i]
        if kind == CONTROL:
            return b""
        if kind == BYTE and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            return bytes([int(tok[3:5], 16)])
        if kind == USER_DEFINED:
            return tok.encode()
        return tok.replace(SPACE, " ").encode()

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        out = b"".join(self._bytes[i] for i in token_ids)
        # as llama-cpp-python's detokenize: the space prefix that follows a BOS is not part of the text
        if token_ids and token_ids[0] == self.bos_id and out.startswith(b" "):
            out = out[1:]
        return out

    def decode(self, token_ids: Sequence[int]) -> str:
        out = b"".join(self.tokens[i].encode() if self.types[i] == CONTROL else self._bytes[i] for i in token_ids)
        return out.decode("utf-8", errors="replace")
