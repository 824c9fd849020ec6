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

import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are skipped (only their length is kept) unless their key is requested.
SMALL_ARRAY_LIMIT = 64

# value type -> struct format (scalars)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


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


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path
        self.size = len(buf)

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise ModelFormatError(
                f"{self.path} is truncated: its GGUF header needs more than the file's {self.size} bytes",
                "the download or copy was cut short: download the file again",
            )

    def scalar(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > 1 << 30:
            raise ModelFormatError(f"{self.path} is corrupt: a GGUF string claims {n} bytes",
                                   "the file is damaged: download it again")
        self.need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.scalar("<Q")
        self.need(n)
        self.pos += n


def _read_value(cur: _Cursor, vtype: int, keep_array: bool) -> Any:
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        etype = cur.scalar("<I")
        length = cur.scalar("<Q")
        if length > 1 << 32:
            raise ModelFormatError(f"{cur.path} is corrupt: a GGUF array claims {length} elements",
                                   "the file is damaged: download it again")
        start = cur.pos
        if keep_array or length <= SMALL_ARRAY_LIMIT:
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                cur.need(size * length)
                values = list(struct.unpack_from(f"<{length}{fmt[1]}", cur.buf, cur.pos))
                cur.pos += size * length
                return values
            return [_read_value(cur, etype, keep_array) for _ in range(length)]
        if etype in _SCALARS:
            size = struct.calcsize(_SCALARS[etype])
            cur.need(size * length)
            cur.pos += size * length
        elif etype == _STRING:
            for _ in range(length):
                cur.skip_string()
        else:
            for _ in range(length):
                _read_value(cur, etype, False)
        return SkippedArray(etype, length, start)
    raise ModelFormatError(f"{cur.path} is corrupt: unknown GGUF value type {vtype}",
                           "the file is damaged or from a newer GGUF version: download it again")


def _tensor_bytes(ggml_type: int, n_elements: int, path: Path, name: str) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFormatError(f"{path}: tensor {name} has unknown ggml type {ggml_type}",
                               "the file is corrupt or needs a newer gguf package: pip install -U gguf") from None
    return n_elements // block * type_size


def read_header(path: str | os.PathLike[str], keep_arrays: Iterable[str] = (), file_index: int = 0) -> GGUFHeader:
    """Parse one GGUF file's header.  Raises ModelFormatError for a missing, non-GGUF, truncated or corrupt file."""
    path = Path(path)
    keep = set(keep_arrays)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise ModelFormatError(f"{path} does not exist", "check the path, or list models with `hearth models`") from None
    except IsADirectoryError:
        raise ModelFormatError(f"{path} is a directory, not a GGUF file",
                               "point at the .gguf file inside it") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise ModelFormatError(f"{path} is not a GGUF file ({size} bytes)",
                                   "hearth loads .gguf model files: check the path")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != GGUF_MAGIC:
                raise ModelFormatError(f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF')",
                                       "hearth loads .gguf model files: convert or download a GGUF")
            cur = _Cursor(buf, path)
            cur.pos = 4
            version = cur.scalar("<I")
            if version not in (2, 3):
                raise ModelFormatError(f"{path} has GGUF version {version}; hearth reads versions 2 and 3",
                                       "re-convert the model with a current llama.cpp")
            n_tensors = cur.scalar("<Q")
            n_kv = cur.scalar("<Q")
            if n_tensors > 1 << 20 or n_kv > 1 << 20:
                raise ModelFormatError(f"{path} is corrupt: it claims {n_tensors} tensors and {n_kv} metadata keys",
                                       "the file is damaged: download it again")
            metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cur.string()
                vtype = cur.scalar("<I")
                metadata[key] = _read_value(cur, vtype, key in keep)
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.scalar("<I")
                if n_dims > 8:
                    raise ModelFormatError(f"{path} is corrupt: tensor {name} claims {n_dims} dimensions",
                                           "the file is damaged: download it again")
                shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
                ggml_type = cur.scalar("<I")
                offset = cur.scalar("<Q")
                n_el = 1
                for d in shape:
                    n_el *= d
                infos.append(GGUFTensorInfo(name, shape, ggml_type, offset,
                                            _tensor_bytes(ggml_type, n_el, path, name), n_el, file_index))
            alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
            data_offset = (cur.pos + alignment - 1) // alignment * alignment
    end = max((data_offset + t.offset + t.n_bytes for t in infos), default=data_offset)
    if end > size:
        raise ModelFormatError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}",
            "the download or copy was cut short: download the file again",
        )
    return GGUFHeader(path, version, metadata, tuple(infos), data_offset, size)


def split_paths(first: Path, count: int) -> list[Path]:
    """The shard files of a split GGUF (`name-00001-of-00003.gguf`), given the first one."""
    import re

    m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", first.name)
    if not m:
        raise ModelFormatError(f"{first} says it is split into {count} files, but its name is not "
                               "NAME-00001-of-0000N.gguf", "keep the shards' original names")
    return [first.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_model_header(path: str | os.PathLike[str], keep_arrays: Iterable[str] = ()) -> tuple[GGUFHeader, list[GGUFHeader]]:
    """Read a GGUF and, when it is the first shard of a split model, the tensor infos of every shard.

    Returns (header of the first file, headers of all shards including the first)."""
    first = read_header(path, keep_arrays)
    count = int(first.metadata.get("split.count", 1) or 1)
    if count <= 1:
        return first, [first]
    shards = [first]
    for i, shard in enumerate(split_paths(first.path, count)[1:], start=1):
        if not shard.exists():
            raise ModelFormatError(f"{first.path} is shard 1 of {count}, but {shard.name} is missing",
                                   "download every shard of the model into the same folder")
        shards.append(read_header(shard, (), file_index=i))
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
                out[i] = cur.string()
            else:
                cur.skip_string()
    return out
