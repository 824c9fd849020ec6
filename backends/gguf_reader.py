"""Read a GGUF file's header (metadata and tensor infos) fast, without loading weights or vocabularies.

Why not `gguf.GGUFReader` for this: it builds one numpy array per string, so opening a 262k-token vocabulary
takes 11 s (Gemma 3) and `hearth models` over a shelf of models would crawl.  The header format is small and
stable (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md); this reader walks it with struct over an
mmap and *skips* large arrays (token lists, merges, scores) unless asked for by key, recording their length
(the metadata's part: backends.gguf_metadata).
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError
from backends.gguf_constants import constants
from backends.gguf_metadata import MAX_ARRAY_DEPTH as MAX_ARRAY_DEPTH
from backends.gguf_metadata import MAX_ARRAY_LENGTH as MAX_ARRAY_LENGTH
from backends.gguf_metadata import MAX_METADATA_READ_BYTES as MAX_METADATA_READ_BYTES
from backends.gguf_metadata import MAX_STRING_BYTES as MAX_STRING_BYTES
from backends.gguf_metadata import PER_LAYER_ARRAY_LIMIT as PER_LAYER_ARRAY_LIMIT
from backends.gguf_metadata import PER_LAYER_SUFFIXES as PER_LAYER_SUFFIXES
from backends.gguf_metadata import SMALL_ARRAY_LIMIT as SMALL_ARRAY_LIMIT
from backends.gguf_metadata import STRING, Cursor, read_metadata
from backends.gguf_metadata import TYPE_NAMES as TYPE_NAMES
from backends.gguf_metadata import SkippedArray as SkippedArray
from backends.gguf_metadata import corrupt as _corrupt

# (the "X as X" imports above: the metadata's caps and types, importable from here as before they moved)

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Caps on what a header may claim, checked before any of it is read, so that a hostile or damaged header costs
# milliseconds and a few MiB, never a hang or gigabytes.  Real models stay far below them: ~60 metadata keys,
# at most a few thousand tensors (DeepSeek V3: ~1,800), a 262,144-entry vocabulary (Gemma 3), chat templates of
# tens of KiB, flat arrays.  README "Limits on model files" lists them (the caps on metadata values live with
# their reader in backends.gguf_metadata).
MAX_TENSORS = 65_536  # tensor infos per file
MAX_METADATA_KEYS = 4_096
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME (64) less its NUL
MAX_SPLITS = 1_024  # shards of one split model


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


def _gguf_cursor(buf: mmap.mmap, path: Path) -> Cursor:
    """A cursor just past the magic of a file that starts with it."""
    if buf[:4] != GGUF_MAGIC:
        raise ModelFormatError(
            f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF')",
            "hearth loads .gguf model files: convert or download a GGUF",
        )
    cur = Cursor(buf, path)
    cur.pos = 4
    return cur


def _read_counts(cur: Cursor) -> tuple[int, int, int]:
    """(version, tensor count, metadata count), refused outside the versions hearth reads and the caps above."""
    path = cur.path
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
    return version, n_tensors, n_kv


def _read_tensor_info(cur: Cursor, file_index: int) -> GGUFTensorInfo:
    """One entry of the tensor table: name, n_dims, dims, ggml type, offset."""
    path = cur.path
    name = cur.string("a tensor name")
    if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:
        raise _corrupt(path, f"tensor name {name[:40]!r}... is longer than ggml's {MAX_TENSOR_NAME_BYTES} bytes")
    n_dims = cur.scalar("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _corrupt(path, f"tensor {name} claims {n_dims} dimensions (ggml has 1 to {MAX_DIMS})")
    shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
    ggml_type = cur.scalar("<I")
    offset = cur.scalar("<Q")
    n_bytes, n_el = _tensor_bytes(ggml_type, shape, path, name)
    return GGUFTensorInfo(name, shape, ggml_type, offset, n_bytes, n_el, file_index)


def _check_fits(path: Path, infos: list[GGUFTensorInfo], data_offset: int, size: int) -> None:
    """Every tensor's data inside the file."""
    end = max((data_offset + t.offset + t.n_bytes for t in infos), default=data_offset)
    if end > size:
        raise ModelFormatError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}",
            "the download or copy was cut short: download the file again",
        )


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
            cur = _gguf_cursor(buf, path)
            version, n_tensors, n_kv = _read_counts(cur)
            metadata, types = read_metadata(cur, n_kv, keep)
            infos = [_read_tensor_info(cur, file_index) for _ in range(n_tensors)]
            alignment = _alignment(path, metadata, types)
            data_offset = (cur.pos + alignment - 1) // alignment * alignment
    _check_layout(path, infos, alignment)
    _check_fits(path, infos, data_offset, size)
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
    if array.element_type != STRING or not wanted:
        return {}
    out: dict[int, str] = {}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = Cursor(buf, Path(path))
        cur.pos = array.offset
        want = set(wanted)
        for i in range(wanted[-1] + 1):
            if i in want:
                out[i] = cur.string("a token")
            else:
                cur.skip_string("a token")
    return out
