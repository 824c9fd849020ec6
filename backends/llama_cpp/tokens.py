"""Prompt tokenization through llama.cpp in time linear in the prompt's length.

llama.cpp splits a prompt at special tokens (`tokenizer_st_partition`) in a linked list that it walks from
the head for every split, so its cost grows with the square of the number of special tokens in the text: a
chat of 30,000 empty messages (60,000 `<|im_start|>`/`<|im_end|>`) took over a minute.  Here the text is cut,
in one linear regex pass, into chunks that each start at a special token and hold at most CHUNK_SPECIALS of
them, and each chunk goes to llama.cpp on its own; llama.cpp tokenizes the text between two special tokens
independently of the rest, so the ids are the same as one call's (tests compare them).  Two fine points keep
that true: the BOS/EOS a call adds are added once, around the whole; a token with the LSTRIP attribute (it
eats the whitespace before it) is never a cut point.  A vocabulary llama.cpp tokenizes differently (WPM,
RWKV, ...) keeps the single call.

The cut points come from a leftmost-longest match of the special tokens' texts (a trie compiled into one
regex, so the pass is linear whatever the vocabulary's size); llama.cpp instead matches the longest token
first everywhere.  The two agree unless two special tokens' occurrences overlap in the text, which no real
chat format produces; where they would not, a cut could fall differently (the chunks are still tokenized by
llama.cpp itself, so the result is a valid tokenization of the same text).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

from backends.errors import InvalidRequestError

CHUNK_SPECIALS = 64  # special tokens per llama.cpp call: its quadratic term stays ~4000 steps per call
_SPLITTING_TYPES = (1, 2, 4)  # LLAMA_VOCAB_TYPE_SPM, _BPE, _UGM: fragments between specials are independent
_ATTR_UNKNOWN, _ATTR_CONTROL, _ATTR_USER_DEFINED, _ATTR_LSTRIP = 1, 8, 16, 128


class _Splitter:
    """Where a text may be cut for llama.cpp: the special tokens of one model's vocabulary."""

    def __init__(self, llm: Any) -> None:
        import llama_cpp  # lazy: heavy: llama_cpp

        vocab = self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.vocab_type = int(llama_cpp.llama_vocab_type(vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(vocab)) if llama_cpp.llama_vocab_get_add_bos(vocab) else None
        self.eos = int(llama_cpp.llama_vocab_eos(vocab)) if llama_cpp.llama_vocab_get_add_eos(vocab) else None
        parsed: list[str] = []  # tokens llama.cpp matches when parse_special is on
        always: list[str] = []  # user-defined tokens: matched even with parse_special off
        for token_id in range(int(llama_cpp.llama_vocab_n_tokens(vocab))):
            attr = int(llama_cpp.llama_vocab_get_attr(vocab, token_id))
            if not attr & (_ATTR_UNKNOWN | _ATTR_CONTROL | _ATTR_USER_DEFINED) or attr & _ATTR_LSTRIP:
                continue
            try:
                text = (llama_cpp.llama_vocab_get_text(vocab, token_id) or b"").decode("utf-8")
            except UnicodeDecodeError:
                continue  # cannot occur whole in a str prompt
            if text:
                parsed.append(text)
                if attr & _ATTR_USER_DEFINED:
                    always.append(text)
        self.patterns = {True: _trie_regex(parsed), False: _trie_regex(always)}

    def chunks(self, text: str, parse_special: bool) -> list[str]:
        pattern = self.patterns[parse_special]
        if pattern is None:
            return [text]
        starts = [m.start() for m in pattern.finditer(text)]
        cuts = [0, *starts[CHUNK_SPECIALS::CHUNK_SPECIALS], len(text)]
        return [text[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def _trie_regex(words: list[str]) -> re.Pattern[str] | None:
    """One regex matching any of `words`, longest first at each position, in time linear in the text."""
    if not words:
        return None
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body  # greedy: the longer token wins, the shorter one is kept

    return re.compile(emit(trie))


_splitters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _splitter(llm: Any) -> _Splitter:
    with _lock:
        splitter = _splitters.get(llm)
        if splitter is None:
            splitter = _splitters[llm] = _Splitter(llm)
        return splitter


def tokenize(llm: Any, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llm.tokenize(text) as llama.cpp would give it, in linear time (see the module docstring)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"the prompt is not valid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}",
            "send text that encodes as UTF-8",
        ) from None
    splitter = _splitter(llm)
    chunks = splitter.chunks(text, parse_special) if splitter.vocab_type in _SPLITTING_TYPES else [text]
    if len(chunks) <= 1:
        return list(llm.tokenize(data, add_bos=add_special, special=parse_special))
    ids = [splitter.bos] if add_special and splitter.bos is not None else []
    for chunk in chunks:
        ids.extend(_llama_tokenize(splitter.vocab, chunk.encode("utf-8"), parse_special))
    if add_special and splitter.eos is not None:
        ids.append(splitter.eos)
    return ids


def _llama_tokenize(vocab: Any, data: bytes, parse_special: bool) -> list[int]:
    """llama_tokenize without BOS/EOS into a buffer sized for `data` (llama-cpp-python's Llama.tokenize
    allocates one of the training context's size per call, which dominated the cost of many small calls)."""
    import llama_cpp  # lazy: heavy: llama_cpp

    size = len(data) + 4  # at most a token per byte, plus a space prefix (SPM)
    while True:
        buf = (llama_cpp.llama_token * size)()
        n = int(llama_cpp.llama_tokenize(vocab, data, len(data), buf, size, False, parse_special))
        if n >= 0:
            return buf[:n]
        size = -n
