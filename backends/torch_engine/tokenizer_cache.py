"""The byte-level BPE tokenizer built from a GGUF's vocabulary (tokenizer.py), kept on disk beside the prepared
weights (weight_cache.py) so that a later start reads it instead of building it again.

Building it means reading the GGUF's token and merge arrays in Python and handing 49 k tokens and 49 k merges to
the `tokenizers` library: 0.16-0.34 s of the starter's start on the 2-core Xeon; the library's own JSON form
loads in 0.10-0.23 s (same runs, interleaved).  Only HearthTokenizer (byte-level BPE) is kept; SentencePiece
vocabularies (spm_tokenizer.py) are built each time.

An entry is `<key>.tok` in the weight cache's folder: one JSON object with the tokenizer's JSON and the
per-token bytes (the special-token ids and flags come from the ModelSpec, read from the same file).  The key
names what changes the result, like the weights' (entry_key): the model file(s) (resolved path, size, mtime in
ns), TOKENIZER_FORMAT and the tokenizers version; a changed model file misses, and the folder's size bound
evicts `.tok` entries with the `.pt` ones (WeightCache.entries).  Written to a temporary file and renamed (a
reader sees a whole entry or none); an entry that does not parse, or holds another key or format, is deleted
and is a miss: the caller builds the tokenizer from the GGUF again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.atomic_write import write_text_atomically

log = logging.getLogger(__name__)

TOKENIZER_FORMAT = 1  # bump when what the entry holds, or how tokenizer.py builds the tokenizer, changes
SUFFIX = ".tok"


def tokenizer_key(files: Sequence[str | os.PathLike[str]], version: str) -> str:
    """The key of a model's tokenizer entry: its files (resolved path, size, mtime in ns), TOKENIZER_FORMAT and
    the tokenizers library's `version`."""
    parts = {"format": TOKENIZER_FORMAT, "tokenizers": version, "files": file_stamps(files)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def file_stamps(files: Sequence[str | os.PathLike[str]]) -> list[list[Any]]:
    """[resolved path, size, mtime in ns] per model file: what a cache key takes from the files, so that a changed
    file misses.  Shared with the prepared weights' key (weight_cache.entry_key); here because this module
    imports no torch."""
    stamps = []
    for f in files:
        p = Path(f).resolve()
        st = p.stat()
        stamps.append([str(p), st.st_size, st.st_mtime_ns])
    return stamps


def load_entry(folder: str | os.PathLike[str], key: str) -> dict[str, Any] | None:
    """The entry's fields (`tokenizer`: the library's JSON; `token_bytes`: list of bytes), or None: no entry, or
    a corrupt one (then deleted)."""
    path = Path(folder) / f"{key}{SUFFIX}"
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("key") != key or data.get("format") != TOKENIZER_FORMAT:
            raise ValueError(f"it holds key {data.get('key')} format {data.get('format')}")
        if not isinstance(data["tokenizer"], str):
            raise ValueError("its tokenizer is not a JSON string")
        data["token_bytes"] = [bytes.fromhex(h) for h in data["token_bytes"]]
    except Exception as exc:  # noqa: BLE001 - any unreadable entry is a miss, and is rebuilt
        log.warning("tokenizer cache entry %s is unreadable (%s): building the tokenizer afresh", path, exc)
        drop_entry(folder, key)
        return None
    try:
        os.utime(path)  # recently used: evicted last, as the weight entries are
    except OSError:
        pass
    return data


def store_entry(folder: str | os.PathLike[str], key: str, fields: dict[str, Any]) -> Path | None:
    """Write the entry atomically (temporary file + rename); None when it could not be written (a cache that
    cannot write never fails a load).  `fields`: `tokenizer` (str) and `token_bytes` (list of bytes)."""
    folder = Path(folder)
    path = folder / f"{key}{SUFFIX}"
    blob = {**fields, "token_bytes": [b.hex() for b in fields["token_bytes"]], "key": key, "format": TOKENIZER_FORMAT}
    try:
        return write_text_atomically(path, json.dumps(blob))
    except OSError as exc:
        log.warning("could not write the tokenizer cache entry %s: %s", path, exc)
        return None


def drop_entry(folder: str | os.PathLike[str], key: str) -> None:
    """Delete the entry (a corrupt one: the next start builds and stores it again)."""
    try:
        (Path(folder) / f"{key}{SUFFIX}").unlink()
    except OSError:
        pass
