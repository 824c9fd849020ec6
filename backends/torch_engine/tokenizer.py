"""Tokenizers whose ids equal llama.cpp's: built with the `tokenizers` library from a GGUF's own fields
(tokens, merges, token types, tokenizer.ggml.pre), or read from a Hugging Face folder's tokenizer.json;
SentencePiece "llama" GGUF vocabularies go to spm_tokenizer.SpmTokenizer.

GGUF "gpt2" (byte-level BPE) models: each `tokenizer.ggml.pre` value has its own pre-tokenizer rules, copied
from the regexes llama.cpp's llama-vocab.cpp uses for it (`_PRE` below).  Token type 3 (control) and 4
(user-defined) are special: matched whole in the text when parse_special is on, never merged across.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError, UnsupportedArchitectureError
from backends.gguf_reader import read_header
from backends.modelspec import ModelSpec
from backends.torch_engine.spm_tokenizer import SpmTokenizer
from backends.torch_engine.tokenizer_cache import drop_entry, load_entry, store_entry, tokenizer_key

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# pre value -> ("digits" | regex): "digits" = split digits one by one, then GPT-2's byte-level regex
_PRE = {"smollm": "digits", "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "qwen2": _QWEN2, "gpt2": None, "default": None}
CONTROL, USER_DEFINED = 3, 4


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-unicode table, inverted: char -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class HearthTokenizer:
    """encode(text, add_special, parse_special) -> ids; decode(ids) -> text; token_bytes(ids) -> reply bytes."""

    def __init__(
        self, tk, bos_id: int | None, eos_id: int | None, add_bos: bool, add_eos: bool, token_bytes_table: list[bytes]
    ) -> None:
        self._tk = tk
        self._lock = threading.Lock()  # encode_special_tokens is a property of the shared tokenizer
        self.bos_id, self.eos_id, self.add_bos, self.add_eos = bos_id, eos_id, add_bos, add_eos
        self._bytes = token_bytes_table  # per id: its text as bytes; b"" for control tokens

    @property
    def vocab_size(self) -> int:
        return len(self._bytes)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        with self._lock:
            self._tk.encode_special_tokens = not parse_special
            ids = list(self._tk.encode(text, add_special_tokens=False).ids)
        if add_special and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tk.decode(list(token_ids), skip_special_tokens=False)

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        return b"".join(self._bytes[i] for i in token_ids)


def load_tokenizer(spec: ModelSpec, cache_folder: str | None = None) -> Any:
    """A HearthTokenizer (byte-level BPE, HF folders) or an SpmTokenizer (GGUF "llama" vocabularies).
    `cache_folder`: where a GGUF's byte-level BPE tokenizer is kept once built (tokenizer_cache.py; the torch
    engine passes its prepared-weight cache folder), None: built from the file every time."""
    if spec.format != "gguf":
        return _from_hf(spec)
    if cache_folder:
        return _from_gguf_cached(spec, cache_folder)
    return _from_gguf(spec)


def _from_gguf_cached(spec: ModelSpec, folder: str) -> Any:
    import tokenizers  # lazy: heavy: tokenizers

    key = tokenizer_key(spec.files or (spec.path,), tokenizers.__version__)
    entry = load_entry(folder, key)
    if entry is not None:
        try:
            tk = tokenizers.Tokenizer.from_str(entry["tokenizer"])
        except Exception:  # noqa: BLE001 - the library raises a bare Exception; a bad entry is a miss
            drop_entry(folder, key)
        else:
            eos = spec.eos_token_ids[0] if spec.eos_token_ids else None
            return HearthTokenizer(
                tk, spec.bos_token_id, eos, spec.add_bos_token, spec.add_eos_token, entry["token_bytes"]
            )
    tok = _from_gguf(spec)
    if isinstance(tok, HearthTokenizer):
        store_entry(folder, key, {"tokenizer": tok._tk.to_str(), "token_bytes": tok._bytes})
    return tok


def _from_gguf(spec: ModelSpec) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers  # lazy: heavy: tokenizers

    keys = ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"]
    md = read_header(spec.path, keep_arrays=keys).metadata
    model, pre = md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre", "default")
    if model == "llama":  # SentencePiece vocabularies (Llama 1/2, Mistral): backends/torch_engine/spm_tokenizer.py
        return SpmTokenizer(
            md["tokenizer.ggml.tokens"],
            md.get("tokenizer.ggml.scores") or [],
            md.get("tokenizer.ggml.token_type") or [],
            spec.bos_token_id,
            spec.eos_token_ids[0] if spec.eos_token_ids else None,
            md.get("tokenizer.ggml.unknown_token_id"),
            spec.add_bos_token,
            spec.add_eos_token,
            bool(md.get("tokenizer.ggml.add_space_prefix", True)),
        )
    if model != "gpt2" or pre not in _PRE:  # _PRE's keys are hwprobe.support.TORCH_ENGINE_GGUF_PRE_TOKENIZERS
        raise UnsupportedArchitectureError(
            f"the torch engine's tokenizer handles byte-level BPE GGUFs with pre-tokenizer "
            f"{', '.join(sorted(_PRE))}; {spec.name} has tokenizer {model!r} / {pre!r}",
            "use --backend llama.cpp for this model",
        )
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=merges,
        fuse_unk=False,
        ignore_merges=pre in ("llama-bpe", "llama3"),
    )
    tk = Tokenizer(bpe)
    rule = _PRE[pre]
    if rule == "digits":
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    elif rule is None:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(rule), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tk.decoder = decoders.ByteLevel()
    special = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    table = _byte_decoder()
    token_bytes = []
    for tok, kind in zip(tokens, types):
        if kind == CONTROL:
            token_bytes.append(b"")
        elif kind == USER_DEFINED:
            token_bytes.append(tok.encode())
        else:
            token_bytes.append(bytes(table[c] for c in tok if c in table))
    return HearthTokenizer(
        tk,
        spec.bos_token_id,
        spec.eos_token_ids[0] if spec.eos_token_ids else None,
        spec.add_bos_token,
        spec.add_eos_token,
        token_bytes,
    )


def _from_hf(spec: ModelSpec) -> HearthTokenizer:
    from tokenizers import Tokenizer  # lazy: heavy: tokenizers

    path = Path(spec.path) / "tokenizer.json"
    try:
        tk = Tokenizer.from_file(str(path))
        data = json.loads(path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a bad file
        raise ModelFormatError(
            f"{path} is not a tokenizer the tokenizers library can load: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}",
            "download the model's tokenizer.json again",
        ) from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} holds no tokenizer object", "download the model's tokenizer.json again")
    special = {t["id"] for t in data.get("added_tokens", []) if t.get("special")}
    size = tk.get_vocab_size(with_added_tokens=True)
    token_bytes = [b"" if i in special else tk.decode([i], skip_special_tokens=False).encode() for i in range(size)]
    return HearthTokenizer(
        tk, spec.bos_token_id, spec.eos_token_ids[0] if spec.eos_token_ids else None, False, False, token_bytes
    )
