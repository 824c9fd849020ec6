"""The metadata part of a GGUF header, read with bounds: a cursor over the file's mmap and the reader of one
metadata value, which *skips* large arrays (token lists, merges, scores) unless their key is asked for, recording
their length.  backends.gguf_reader walks the rest of the header (counts, tensor infos, layout) with them.

A metadata entry is (key string, u32 value type, value); a string is a u64 length and its bytes; an array is a
u32 element type, a u64 length and its elements.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError

# Arrays longer than this are skipped (only their length is kept) unless their key is requested.
SMALL_ARRAY_LIMIT = 64
# Per-layer values (llama.cpp's get_key_or_arr keys) are read whole even past SMALL_ARRAY_LIMIT: one per layer.
PER_LAYER_SUFFIXES = (
    ".attention.head_count",
    ".attention.head_count_kv",
    ".feed_forward_length",
    ".attention.sliding_window_pattern",
)

# Caps on what the metadata may claim, checked before any of it is read (with the tensor caps in gguf_reader),
# so that a hostile or damaged header costs milliseconds and a few MiB, never a hang or gigabytes.  Real models
# stay far below them: a 262,144-entry vocabulary (Gemma 3), chat templates of tens of KiB, flat arrays.
# README "Limits on model files" lists them.
MAX_ARRAY_LENGTH = 1 << 24  # 16,777,216 elements in one metadata array
MAX_STRING_BYTES = 1 << 20  # 1 MiB for one metadata string (a key, a value, a token)
MAX_ARRAY_DEPTH = 3  # arrays of arrays of arrays; real models use flat arrays
MAX_METADATA_READ_BYTES = 32 << 20  # metadata turned into Python values, 8 B per number or string plus its
# bytes (skipped arrays cost nothing; Gemma 3's whole tokenizer, read by the torch engine, is ~6 MiB)
PER_LAYER_ARRAY_LIMIT = 4_096  # per-layer arrays longer than this are skipped like any other

# value type -> struct format (scalars)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
TYPE_NAMES = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}
# the fewest bytes one element of each type takes in the file: a claimed length is checked against what is left
_MIN_BYTES = {**{t: struct.calcsize(f) for t, f in SCALARS.items()}, STRING: 8, ARRAY: 12}


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array that was not read: its element type and length."""

    element_type: int
    length: int
    offset: int = 0  # file offset of the first element (to read single items later)

    def __len__(self) -> int:
        return self.length


def corrupt(path: Path, what: str) -> ModelFormatError:
    return ModelFormatError(f"{path} is corrupt: {what}", "the file is damaged or not a real model: download it again")


_U64 = struct.Struct("<Q")


class Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = len(buf)
        self.read_bytes = 0  # metadata bytes turned into Python values so far

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise ModelFormatError(
                f"{self.path} is truncated: its GGUF header needs more than the file's {self.size} bytes",
                "the download or copy was cut short: download the file again",
            )

    def charge(self, n: int, key: str) -> None:
        self.read_bytes += n
        if self.read_bytes > MAX_METADATA_READ_BYTES:
            raise corrupt(
                self.path,
                f"its metadata (at {key}) holds more than hearth's limit of "
                f"{MAX_METADATA_READ_BYTES >> 20} MiB of values",
            )

    def scalar(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def _length(self, what: str) -> int:
        n = self.scalar("<Q")
        if n > MAX_STRING_BYTES:
            raise corrupt(
                self.path, f"{what} claims a string of {n:,} bytes; hearth reads at most {MAX_STRING_BYTES:,} (1 MiB)"
            )
        self.need(n)
        return n

    def string(self, what: str) -> str:
        n = self._length(what)
        self.charge(8 + n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row (a vocabulary: ~100k of them in a tokenizer's tokens and merges): what
        `string` does for each, with the same limits and errors, in one loop over local names; a vocabulary
        read 3x faster than through `string` (the torch engine reads one at every start)."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        budget = MAX_METADATA_READ_BYTES - self.read_bytes
        out: list[str] = []
        append = out.append
        start = pos
        for _ in range(count):
            if pos + 8 > size:
                break  # `string` raises the error below
            (n,) = unpack(buf, pos)
            end = pos + 8 + n
            if n > MAX_STRING_BYTES or end > size or end - start > budget:
                break
            append(bytes(buf[pos + 8 : end]).decode("utf-8", errors="replace"))
            pos = end
        self.read_bytes += pos - start
        self.pos = pos
        while len(out) < count:  # the one that stopped the loop: read as `string` reads it, which raises
            append(self.string(what))
        return out

    def skip_string(self, what: str) -> None:
        n = self._length(what)
        self.pos += n


def _read_value(cur: Cursor, vtype: int, keep: int, key: str, depth: int = 0) -> Any:
    """One metadata value; arrays of more than `keep` elements are skipped (a SkippedArray)."""
    if vtype in SCALARS:
        cur.charge(8, key)
        return cur.scalar(SCALARS[vtype])
    if vtype == STRING:
        return cur.string(f"metadata {key}")
    if vtype != ARRAY:
        raise ModelFormatError(
            f"{cur.path} is corrupt: metadata {key} has unknown GGUF value type {vtype}",
            "the file is damaged or from a newer GGUF version: download it again",
        )
    if depth >= MAX_ARRAY_DEPTH:
        raise corrupt(
            cur.path,
            f"metadata {key} nests arrays more than {MAX_ARRAY_DEPTH} deep "
            f"(hearth's limit; real models use flat arrays)",
        )
    etype = cur.scalar("<I")
    length = cur.scalar("<Q")
    if etype not in _MIN_BYTES:
        raise ModelFormatError(
            f"{cur.path} is corrupt: metadata {key} is an array of unknown GGUF type {etype}",
            "the file is damaged or from a newer GGUF version: download it again",
        )
    if length > MAX_ARRAY_LENGTH:
        raise corrupt(
            cur.path, f"metadata {key} claims {length:,} elements; hearth reads arrays of at most {MAX_ARRAY_LENGTH:,}"
        )
    if length * _MIN_BYTES[etype] > cur.size - cur.pos:
        raise ModelFormatError(
            f"{cur.path} is truncated: metadata {key} claims {length:,} elements, more than "
            f"the file's remaining {cur.size - cur.pos:,} bytes hold",
            "the download or copy was cut short, or the file is damaged: download it again",
        )
    start = cur.pos
    if length <= keep:
        if etype in SCALARS:
            fmt = SCALARS[etype]
            size = struct.calcsize(fmt)
            cur.charge(8 * length, key)
            values = list(struct.unpack_from(f"<{length}{fmt[1]}", cur.buf, cur.pos))
            cur.pos += size * length
            return values
        if etype == STRING:
            return cur.strings(length, f"metadata {key}")
        return [_read_value(cur, etype, keep, key, depth + 1) for _ in range(length)]
    if etype in SCALARS:
        cur.pos += _MIN_BYTES[etype] * length
    elif etype == STRING:
        for _ in range(length):
            cur.skip_string(f"metadata {key}")
    else:
        for _ in range(length):
            _read_value(cur, etype, 0, key, depth + 1)
    return SkippedArray(etype, length, start)


def _type_name(cur: Cursor, vtype: int, start: int) -> str:
    """ "uint32", "string", or "array[ELEMENT]" for the value that begins at `start` (just after its type)."""
    if vtype != ARRAY:
        return TYPE_NAMES.get(vtype, str(vtype))
    (etype,) = struct.unpack_from("<I", cur.buf, start)
    return f"array[{TYPE_NAMES.get(etype, str(etype))}]"


def _array_limit(key: str, keep: set[str]) -> int:
    """How many elements of `key`'s array are read rather than skipped: all of a requested key's, one per layer
    of a per-layer key's, a few of any other's."""
    return (
        MAX_ARRAY_LENGTH
        if key in keep
        else PER_LAYER_ARRAY_LIMIT
        if key.endswith(PER_LAYER_SUFFIXES)
        else SMALL_ARRAY_LIMIT
    )


def read_metadata(cur: Cursor, n_kv: int, keep: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """`n_kv` metadata entries from the cursor: (key -> value, key -> GGUF type as written).  Arrays longer than
    their key's limit are SkippedArray; keys in `keep` are read whole (up to MAX_ARRAY_LENGTH)."""
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        if key in metadata:
            raise corrupt(cur.path, f"metadata key {key} appears twice")
        vtype = cur.scalar("<I")
        types[key] = (
            _type_name(cur, vtype, cur.pos)
            if vtype == ARRAY and cur.pos + 4 <= cur.size
            else TYPE_NAMES.get(vtype, str(vtype))
        )
        metadata[key] = _read_value(cur, vtype, _array_limit(key, keep), key)
    return metadata, types
