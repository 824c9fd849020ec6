"""Raw GGUF bytes for the hostile-input tests: parse a valid file into its parts, change any part (metadata of any
type or nesting, tensor infos with any offset or shape, counts that lie), and write it back.

Independent of hearth's own reader on purpose: the tests must be able to build what that reader refuses.
Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic, u32 version, u64 tensor count,
u64 metadata count, metadata (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims,
u32 ggml type, u64 offset), padding to the alignment, data.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}


def string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def encode(vtype: int, value: Any) -> bytes:
    """A value's bytes (without its type): scalars, strings, and arrays given as (element type, [items])."""
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], value)
    if vtype == STRING:
        return string(value)
    etype, items = value
    return struct.pack("<IQ", etype, len(items)) + b"".join(encode(etype, v) for v in items)


def nested_array(depth: int) -> bytes:
    """An array of an array of ... (depth levels) ending in an empty array of uint32: 12 bytes a level."""
    inner = struct.pack("<IQ", U32, 0)
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", ARRAY, 1) + inner
    return inner


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    ggml_type: int
    offset: int


@dataclass
class RawGGUF:
    version: int
    kvs: list[tuple[str, int, bytes]]  # (key, value type, encoded value)
    tensors: list[TensorInfo]
    data: bytes
    alignment: int = 32
    n_tensors: int | None = None  # a lying count (None: the true one)
    n_kvs: int | None = None
    trailer: bytes = field(default=b"")

    def set(self, key: str, vtype: int, value: Any) -> RawGGUF:
        return self.set_raw(key, vtype, encode(vtype, value))

    def set_raw(self, key: str, vtype: int, payload: bytes) -> RawGGUF:
        self.drop(key)
        self.kvs.append((key, vtype, payload))
        return self

    def drop(self, key: str) -> RawGGUF:
        self.kvs = [kv for kv in self.kvs if kv[0] != key]
        return self

    def drop_tensor(self, name: str) -> RawGGUF:
        """Remove a tensor and its data, packing the others as a valid file would."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        kept, data = [], bytearray()
        for t in self.tensors:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
            n = 1
            for d in t.shape:
                n *= d
            if t.name != name:
                data += b"\0" * (-len(data) % self.alignment)
                kept.append(TensorInfo(t.name, t.shape, t.ggml_type, len(data)))
                data += self.data[t.offset : t.offset + n // block * size]
        self.tensors, self.data = kept, bytes(data)
        return self

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name)

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF")
        out += struct.pack(
            "<IQQ",
            self.version,
            len(self.tensors) if self.n_tensors is None else self.n_tensors,
            len(self.kvs) if self.n_kvs is None else self.n_kvs,
        )
        for key, vtype, payload in self.kvs:
            out += string(key) + struct.pack("<I", vtype) + payload
        for t in self.tensors:
            out += string(t.name) + struct.pack("<I", len(t.shape))
            out += b"".join(struct.pack("<Q", d) for d in t.shape)
            out += struct.pack("<IQ", t.ggml_type, t.offset)
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out) + self.data + self.trailer

    def write(self, path: Any) -> Any:
        from pathlib import Path

        Path(path).write_bytes(self.to_bytes())
        return path

    @classmethod
    def parse(cls, data: bytes) -> RawGGUF:
        assert data[:4] == b"GGUF"
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
        pos = 24

        def read_str() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + n
            return data[pos - n : pos].decode("utf-8")

        def skip_value(vtype: int) -> None:
            nonlocal pos
            if vtype in _FMT:
                pos += struct.calcsize(_FMT[vtype])
            elif vtype == STRING:
                read_str()
            else:
                etype, length = struct.unpack_from("<IQ", data, pos)
                pos += 12
                for _ in range(length):
                    skip_value(etype)

        kvs = []
        alignment = 32
        for _ in range(n_kv):
            key = read_str()
            (vtype,) = struct.unpack_from("<I", data, pos)
            pos += 4
            start = pos
            skip_value(vtype)
            kvs.append((key, vtype, data[start:pos]))
            if key == "general.alignment":
                (alignment,) = struct.unpack_from("<I", data, start)
        tensors = []
        for _ in range(n_tensors):
            name = read_str()
            (n_dims,) = struct.unpack_from("<I", data, pos)
            shape = list(struct.unpack_from(f"<{n_dims}Q", data, pos + 4))
            pos += 4 + 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", data, pos)
            pos += 12
            tensors.append(TensorInfo(name, shape, ggml_type, offset))
        pos += -pos % alignment
        return cls(version, kvs, tensors, data[pos:], alignment)


# -- edits the tensor-table tests share: each takes a RawGGUF, changes it and returns it -----------------------
def overlap(r: RawGGUF) -> RawGGUF:
    """The fourth tensor starts where the third does."""
    r.tensors[3].offset = r.tensors[2].offset
    return r


def duplicate(r: RawGGUF) -> RawGGUF:
    """The last tensor appears twice in the table."""
    r.tensors.append(r.tensors[-1])
    return r


def zero_size(name: str, dim: int) -> Callable[[RawGGUF], RawGGUF]:
    """Tensor `name` gets a 0 in dimension `dim`."""

    def edit(r: RawGGUF) -> RawGGUF:
        r.tensor(name).shape[dim] = 0
        return r

    return edit
