"""Read a GGUF file's header (metadata and tensor infos) fast, without loading weights or vocabularies.

Why not `gguf.GGUFReader` for this: it builds one numpy array per string, so opening a 262k-token vocabulary
takes 11 s (Gemma 3) and `hearth models` over a shelf of models would crawl.  The header format is small and
stable (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md); this reader walks it with struct over an
mmap and *skips* large arrays (token lists, merges, scores) unless asked for by key, recording their length.
The `gguf` package still supplies the type tables (bytes per block per ggml type, file-type names), and it
remains the tool for reading weights (the torch engine's loader) and writing test files.

Layout: magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata count, then metadata
(key string, u32 value type, value), then tensor infos (name, u32 n_dims, u64 dims[n_dims], u32 ggml type,
u64 offset from the aligned start of the data section).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError
from backends.gguf_constants import constants

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are skipped (only their length is kept) unless their key is requested.
SMALL_ARRAY_LIMIT = 64
# Per-layer values (llama.cpp's get_key_or_arr keys) are read whole even past SMALL_ARRAY_LIMIT: one per layer.
PER_LAYER_SUFFIXES = (
    ".attention.head_count",
    ".attention.head_count_kv",
    ".feed_forward_length",
    ".attention.sliding_window_pattern",
)

# Caps on what a header may claim, checked before any of it is read, so that a hostile or damaged header costs
# milliseconds and a few MiB, never a hang or gigabytes.  Real models stay far below them: ~60 metadata keys,
# at most a few thousand tensors (DeepSeek V3: ~1,800), a 262,144-entry vocabulary (Gemma 3), chat templates of
# tens of KiB, flat arrays.  README "Limits on model files" lists them.
MAX_TENSORS = 65_536  # tensor infos per file
MAX_METADATA_KEYS = 4_096
MAX_ARRAY_LENGTH = 1 << 24  # 16,777,216 elements in one metadata array
MAX_STRING_BYTES = 1 << 20  # 1 MiB for one metadata string (a key, a value, a token)
MAX_ARRAY_DEPTH = 3  # arrays of arrays of arrays; real models use flat arrays
MAX_METADATA_READ_BYTES = 32 << 20  # metadata turned into Python values, 8 B per number or string plus its
# bytes (skipped arrays cost nothing; Gemma 3's whole tokenizer, read by the torch engine, is ~6 MiB)
PER_LAYER_ARRAY_LIMIT = 4_096  # per-layer arrays longer than this are skipped like any other
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME (64) less its NUL
MAX_SPLITS = 1_024  # shards of one split model

# value type -> struct format (scalars)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
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
_MIN_BYTES = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array that was not read: its element type and length."""

    element_type: int
    length: int
    offset: int = 0  # file offset of the first element (to read single items later)

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the fastest-varying (in_features for a weight)
    ggml_type: int  # gguf.GGMLQuantizationType value
    offset: int  # bytes from the start of the data section
    n_bytes: int  # bytes of the tensor's data
    n_elements: int
    file_index: int = 0  # which shard of a split GGUF holds it


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # small values read; big arrays as SkippedArray unless requested
    tensors: tuple[GGUFTensorInfo, ...]
    data_offset: int  # absolute offset of the data section
    file_size: int
    types: dict[str, str] | None = None  # key -> GGUF type as written: "uint32", "string", "array[string]", ...

    def type_of(self, key: str) -> str:
        return (self.types or {}).get(key, "")


def type_error(path: Path, key: str, got: str, expected: str) -> ModelFormatError:
    """Metadata of the wrong GGUF type, named with what was expected (the way llama.cpp reads that key)."""
    return ModelFormatError(
        f"{path}: metadata {key} is {'an' if got[:1] in 'ai' else 'a'} {got}, expected {expected}",
        "the file's metadata is malformed: re-convert the model or download it again",
    )


def _corrupt(path: Path, what: str) -> ModelFormatError:
    return ModelFormatError(f"{path} is corrupt: {what}", "the file is damaged or not a real model: download it again")


_U64 = struct.Struct("<Q")


class _Cursor:
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
            raise _corrupt(
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
            raise _corrupt(
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


def _read_value(cur: _Cursor, vtype: int, keep: int, key: str, depth: int = 0) -> Any:
    """One metadata value; arrays of more than `keep` elements are skipped (a SkippedArray)."""
    if vtype in _SCALARS:
        cur.charge(8, key)
        return cur.scalar(_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string(f"metadata {key}")
    if vtype != _ARRAY:
        raise ModelFormatError(
            f"{cur.path} is corrupt: metadata {key} has unknown GGUF value type {vtype}",
            "the file is damaged or from a newer GGUF version: download it again",
        )
    if depth >= MAX_ARRAY_DEPTH:
        raise _corrupt(
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
        raise _corrupt(
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
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            cur.charge(8 * length, key)
            values = list(struct.unpack_from(f"<{length}{fmt[1]}", cur.buf, cur.pos))
            cur.pos += size * length
            return values
        if etype == _STRING:
            return cur.strings(length, f"metadata {key}")
        return [_read_value(cur, etype, keep, key, depth + 1) for _ in range(length)]
    if etype in _SCALARS:
        cur.pos += _MIN_BYTES[etype] * length
    elif etype == _STRING:
        for _ in range(length):
            cur.skip_string(f"metadata {key}")
    else:
        for _ in range(length):
            _read_value(cur, etype, 0, key, depth + 1)
    return SkippedArray(etype, length, start)


def _type_name(cur: _Cursor, vtype: int, start: int) -> str:
    """ "uint32", "string", or "array[ELEMENT]" for the value that begins at `start` (just after its type)."""
    if vtype != _ARRAY:
        return TYPE_NAMES.get(vtype, str(vtype))
    (etype,) = struct.unpack_from("<I", cur.buf, start)
    return f"array[{TYPE_NAMES.get(etype, str(etype))}]"


def _tensor_bytes(ggml_type: int, shape: tuple[int, ...], path: Path, name: str) -> tuple[int, int]:
    """(bytes, elements) of a tensor; refuses unknown types, empty dimensions and rows that are not whole
    blocks (llama.cpp's own checks)."""
    gguf = constants()
    try:
        qtype = gguf.GGMLQuantizationType(ggml_type)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelFormatError(
            f"{path}: tensor {name} has unknown ggml type {ggml_type}",
            "the file is corrupt or needs a newer gguf package: pip install -U gguf",
        ) from None
    if not shape or min(shape) < 1:
        raise _corrupt(path, f"tensor {name} has shape {list(shape)}, with no elements")
    if shape[0] % block:
        raise _corrupt(
            path,
            f"tensor {name} is {qtype.name} (blocks of {block}) but its rows hold {shape[0]} "
            "values, not a whole number of blocks",
        )
    n_el = 1
    for d in shape:
        n_el *= d
    return n_el // block * type_size, n_el


def open_regular(path: Path, kind: str = "GGUF file") -> int:
    """A read-only descriptor of `path`, refusing (with a reason) what is not a readable regular file: a FIFO
    would block a plain open() forever, and a directory or a symlink loop has nothing to read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelFormatError(
            f"{path} does not exist", "check the path, or list models with `hearth models`"
        ) from None
    except PermissionError:
        raise ModelFormatError(
            f"{path} cannot be read: permission denied on a folder of its path", "check the folders' permissions"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ModelFormatError(
                f"{path} is a symlink loop: its links never reach a file", "point the link at the real model file"
            ) from None
        raise ModelFormatError(f"{path} cannot be read: {exc.strerror}", "check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelFormatError(f"{path} is a directory, not a {kind}", "point at the file inside it")
    if not stat.S_ISREG(st.st_mode):
        what = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )
        raise ModelFormatError(f"{path} is {what}, not a {kind}", "point at a regular file")
    try:  # O_NONBLOCK: should the path have become a FIFO since the stat, opening it must not hang
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except PermissionError:
        raise ModelFormatError(
            f"{path} cannot be read: permission denied", "check the file's permissions (chmod a+r)"
        ) from None
    except OSError as exc:
        raise ModelFormatError(f"{path} cannot be read: {exc.strerror}", "check the path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelFormatError(f"{path} is not a regular file", "point at a regular file")
    return fd


def _check_layout(path: Path, infos: list[GGUFTensorInfo], alignment: int) -> None:
    """The data section as llama.cpp's gguf reader demands it: tensors in table order, each at the previous
    one's end padded to `alignment`, so none is unaligned, overlaps another or leaves a gap; no name twice."""
    seen: set[str] = set()
    expected = 0
    previous = None
    for t in infos:
        if t.name in seen:
            raise _corrupt(path, f"tensor {t.name} appears twice in its tensor table")
        seen.add(t.name)
        if t.offset % alignment:
            raise _corrupt(
                path,
                f"tensor {t.name} starts at data offset {t.offset:,}, not a multiple of the "
                f"file's alignment {alignment}",
            )
        if t.offset < expected:
            raise _corrupt(
                path, f"tensor {t.name} (data offset {t.offset:,}) overlaps {previous}, which ends at {expected:,}"
            )
        if t.offset > expected:
            raise _corrupt(
                path,
                f"tensor {t.name} starts at data offset {t.offset:,}, leaving a gap after "
                f"{previous or 'the start'} (expected {expected:,})",
            )
        expected = (t.offset + t.n_bytes + alignment - 1) // alignment * alignment
        previous = t.name


def _alignment(path: Path, metadata: dict[str, Any], types: dict[str, str]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if types["general.alignment"] != "uint32":
        raise type_error(path, "general.alignment", types["general.alignment"], "uint32")
    if value < 1 or value & (value - 1) or value > 1 << 20:
        raise _corrupt(path, f"general.alignment is {value}, not a power of two up to 1 MiB")
    return int(value)


def read_header(path: str | os.PathLike[str], keep_arrays: Iterable[str] = (), file_index: int = 0) -> GGUFHeader:
    """Parse one GGUF file's header.  Raises ModelFormatError for a missing, unreadable, non-GGUF, truncated,
    corrupt or over-limit file (the caps above), and for a tensor table llama.cpp would refuse."""
    path = Path(path)
    keep = set(keep_arrays)
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise ModelFormatError(
                f"{path} is not a GGUF file ({size} bytes)", "hearth loads .gguf model files: check the path"
            )
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != GGUF_MAGIC:
                raise ModelFormatError(
                    f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF')",
                    "hearth loads .gguf model files: convert or download a GGUF",
                )
            cur = _Cursor(buf, path)
            cur.pos = 4
            version = cur.scalar("<I")
            if version not in (2, 3):
                raise ModelFormatError(
                    f"{path} has GGUF version {version}; hearth reads versions 2 and 3",
                    "re-convert the model with a current llama.cpp",
                )
            n_tensors = cur.scalar("<Q")
            n_kv = cur.scalar("<Q")
            if n_tensors > MAX_TENSORS or n_kv > MAX_METADATA_KEYS:
                raise _corrupt(
                    path,
                    f"it claims {n_tensors:,} tensors and {n_kv:,} metadata keys; hearth reads "
                    f"at most {MAX_TENSORS:,} and {MAX_METADATA_KEYS:,}",
                )
            metadata: dict[str, Any] = {}
            types: dict[str, str] = {}
            for _ in range(n_kv):
                key = cur.string("a metadata key")
                if key in metadata:
                    raise _corrupt(path, f"metadata key {key} appears twice")
                vtype = cur.scalar("<I")
                types[key] = (
                    _type_name(cur, vtype, cur.pos)
                    if vtype == _ARRAY and cur.pos + 4 <= cur.size
                    else TYPE_NAMES.get(vtype, str(vtype))
                )
                limit = (
                    MAX_ARRAY_LENGTH
                    if key in keep
                    else PER_LAYER_ARRAY_LIMIT
                    if key.endswith(PER_LAYER_SUFFIXES)
                    else SMALL_ARRAY_LIMIT
                )
                metadata[key] = _read_value(cur, vtype, limit, key)
            infos = []
            for _ in range(n_tensors):
                name = cur.string("a tensor name")
                if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:
                    raise _corrupt(
                        path, f"tensor name {name[:40]!r}... is longer than ggml's {MAX_TENSOR_NAME_BYTES} bytes"
                    )
                n_dims = cur.scalar("<I")
                if not 1 <= n_dims <= MAX_DIMS:
                    raise _corrupt(path, f"tensor {name} claims {n_dims} dimensions (ggml has 1 to {MAX_DIMS})")
                shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
                ggml_type = cur.scalar("<I")
                offset = cur.scalar("<Q")
                n_bytes, n_el = _tensor_bytes(ggml_type, shape, path, name)
                infos.append(GGUFTensorInfo(name, shape, ggml_type, offset, n_bytes, n_el, file_index))
            alignment = _alignment(path, metadata, types)
            data_offset = (cur.pos + alignment - 1) // alignment * alignment
    _check_layout(path, infos, alignment)
    end = max((data_offset + t.offset + t.n_bytes for t in infos), default=data_offset)
    if end > size:
        raise ModelFormatError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}",
            "the download or copy was cut short: download the file again",
        )
    return GGUFHeader(path, version, metadata, tuple(infos), data_offset, size, types)


def split_paths(first: Path, count: int) -> list[Path]:
    """The shard files of a split GGUF (`name-00001-of-00003.gguf`), given the first one."""
    m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", first.name)
    if not m:
        raise ModelFormatError(
            f"{first} says it is split into {count} files, but its name is not NAME-00001-of-0000N.gguf",
            "keep the shards' original names",
        )
    return [first.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _split_count(header: GGUFHeader) -> int:
    """split.count as llama.cpp reads it (uint16), within MAX_SPLITS; 1 when the model is one file."""
    if "split.count" not in header.metadata:
        return 1
    kind, count = header.type_of("split.count"), header.metadata["split.count"]
    if kind != "uint16":
        raise type_error(header.path, "split.count", kind, "uint16")
    if not 1 <= count <= MAX_SPLITS:
        raise _corrupt(header.path, f"split.count is {count:,}; hearth reads models of 1 to {MAX_SPLITS:,} shards")
    return int(count)


def read_model_header(
    path: str | os.PathLike[str], keep_arrays: Iterable[str] = ()
) -> tuple[GGUFHeader, list[GGUFHeader]]:
    """Read a GGUF and, when it is the first shard of a split model, the tensor infos of every shard.

    Returns (header of the first file, headers of all shards including the first)."""
    first = read_header(path, keep_arrays)
    count = _split_count(first)
    if count <= 1:
        return first, [first]
    shards = [first]
    for i, shard in enumerate(split_paths(first.path, count)[1:], start=1):
        if not shard.exists():
            raise ModelFormatError(
                f"{first.path} is shard 1 of {count}, but {shard.name} is missing",
                "download every shard of the model into the same folder",
            )
        header = read_header(shard, (), file_index=i)
        if _split_count(header) != count or header.metadata.get("split.no", i) != i:
            raise _corrupt(
                shard,
                f"it says it is shard {header.metadata.get('split.no')} of "
                f"{header.metadata.get('split.count')}, expected {i} of {count} "
                "(split.no counts from 0)",
            )
        shards.append(header)
    return first, shards


def read_string_items(path: str | os.PathLike[str], array: SkippedArray, indices: Iterable[int]) -> dict[int, str]:
    """Strings at `indices` of a skipped string array (e.g. the BOS/EOS token texts), walking only up to the
    largest index."""
    wanted = sorted({i for i in indices if 0 <= i < array.length})
    if array.element_type != _STRING or not wanted:
        return {}
    out: dict[int, str] = {}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, Path(path))
        cur.pos = array.offset
        want = set(wanted)
        for i in range(wanted[-1] + 1):
            if i in want:
                out[i] = cur.string("a token")
            else:
                cur.skip_string("a token")
    return out
