"""A disk cache of prepared weights: what the loader and the CPU preparation made of a model file (repacked
GGUF blocks, torch's packed int4 layout, dense prefill copies, embeddings), kept so the next start
maps them instead of making them again.

The cache knows nothing of layouts: an entry is a dict of named plain tensors plus a JSON-able `meta` dict,
filed under a key (`entry_key`) that names everything that changes the result: the model file(s) (resolved path,
size, mtime), PREPARE_FORMAT, torch's version, the CPU (its packing kernels may differ by ISA) and the caller's
options (dtype, weight quantization, ...).  A new packed format or any change to what the preparation produces
only needs PREPARE_FORMAT bumped: old entries then miss and age out.

Files: `<key>.pt` in the cache folder, written by torch.save to a temporary file in the same folder and renamed
into place (atomic on POSIX: a reader sees the old entry, no entry or the whole new one, never a partial one;
concurrent writers of one key each rename a complete file, the last one wins).  No fsync: a file cut short by a
power loss is caught like any other corrupt entry.  Read with torch.load(mmap=True, weights_only=True): the
tensors are copy-on-write views of the page cache, so a hit costs page faults, not a copy, and nothing in the
file can run code.  A file that does not load, or whose meta does not carry this key and format, is deleted and
reported as a miss; the caller prepares afresh and stores again.  Bit flips inside tensor data are not checked
(hashing every byte would cost about what it saves on a small model).

Size: after each store the folder is cut back to `max_bytes`, least recently used entries first (a hit touches
its file's mtime).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.atomic_write import write_atomically
from backends.torch_engine.tokenizer_cache import SUFFIX as TOKENIZER_SUFFIX
from backends.torch_engine.tokenizer_cache import file_stamps

log = logging.getLogger(__name__)

# Bump when what the preparation produces changes (a new packed layout, another dense-copy rule, renamed tensors).
# 2: entries of bf16 models with a plain tied/dense head also hold the int8 decode head's rows (cpu_load.py).
# 3: GGUF Q5_0 and Q6_K projections are kept as int8 blocks (gguf_repack.py), no longer dequantized to bf16.
# 4: the other K-quant, legacy and IQ4/IQ3/IQ2 types kept as int8 too (gguf_repack.REQUANTIZED).
# 5: merged projections of mixed kinds split (split_linear.py), an untied embedding kept quantized
#    (quant_embedding.py): new module kinds in the entries.
PREPARE_FORMAT = 5
DEFAULT_MAX_BYTES = 8 << 30  # the whole cache folder; the starter's entry is ~290 MiB
SUFFIX = ".pt"


@dataclass(frozen=True)
class CacheEntry:
    tensors: dict[str, torch.Tensor]  # as stored: views of the mapped file
    meta: dict[str, Any]  # what the writer put beside them (JSON-able)
    path: Path


def cpu_fingerprint() -> str:
    """The CPU as far as packed-weight layouts may care: model name and ISA flags (torch picks its int4 packing
    per ISA).  A home folder shared between machines keeps one entry per CPU kind."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
        text += "".join(sorted(lines))
    except OSError:  # not Linux: the processor string is what there is
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def entry_key(files: Sequence[str | os.PathLike[str]], options: dict[str, Any]) -> str:
    """The key of a model's prepared weights: its files (resolved path, size, mtime in ns), PREPARE_FORMAT,
    torch's version, the CPU and `options` (every caller setting that changes the tensors)."""
    parts: dict[str, Any] = {
        "format": PREPARE_FORMAT,
        "torch": torch.__version__,
        "cpu": cpu_fingerprint(),
        "options": options,
        "files": file_stamps(files),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _load_one_file(path: Path) -> Any:
    """torch.load(mmap=True) of one file version.  torch opens the path twice (the zip index, then the mapping):
    a writer's rename between the two would pair one entry's index with another's bytes.  Opening the file once
    and handing torch /proc/self/fd/N makes both opens reach that one inode, whatever is renamed meanwhile."""
    proc_fd = Path("/proc/self/fd")
    if not proc_fd.is_dir():  # not Linux: writers of one key write the same tensors, so a mix is of equal files
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        return torch.load(proc_fd / str(fd), map_location="cpu", mmap=True, weights_only=True)
    finally:
        os.close(fd)  # the mapping keeps the inode's pages


class WeightCache:
    """Prepared-weight entries in `folder`, at most `max_bytes` together."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def load(self, key: str) -> CacheEntry | None:
        """The entry for `key`, or None (no entry, or a corrupt one, which is deleted)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            blob = _load_one_file(path)
            meta = json.loads(blob["meta"])
            tensors = blob["tensors"]
            if meta.get("key") != key or meta.get("format") != PREPARE_FORMAT or not isinstance(tensors, dict):
                raise ValueError(f"it holds key {meta.get('key')} format {meta.get('format')}")
            if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
                raise ValueError("it holds something other than tensors")
        except Exception as exc:  # noqa: BLE001 - any unreadable entry is a miss, and is rebuilt
            log.warning("prepared-weight cache entry %s is unreadable (%s): preparing afresh", path, exc)
            self._remove(path)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return CacheEntry(tensors, meta, path)

    def store(self, key: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path | None:
        """Write the entry atomically (temporary file + rename), then evict down to max_bytes.  Returns its path,
        or None when it was not written (no room, a read-only folder, a full disk): a cache that cannot write
        never fails a load."""
        need = sum(t.numel() * t.element_size() for t in tensors.values())
        if need > self.max_bytes:
            log.info("prepared weights (%d bytes) exceed the cache bound (%d): not cached", need, self.max_bytes)
            return None
        path = self.path(key)
        blob = {"meta": json.dumps({**meta, "key": key, "format": PREPARE_FORMAT}), "tensors": tensors}
        try:
            write_atomically(path, lambda f: torch.save(blob, f))
        except (OSError, RuntimeError) as exc:
            log.warning("could not write the prepared-weight cache entry %s: %s", path, exc)
            return None
        self.evict(keep=path)
        return path

    def entries(self) -> list[Path]:
        try:
            # the tokenizers kept beside the weights (tokenizer_cache.py) share the folder's bound
            kept = (SUFFIX, TOKENIZER_SUFFIX)
            return [p for p in self.folder.iterdir() if p.suffix in kept and not p.name.startswith(".")]
        except OSError:
            return []

    def evict(self, keep: Path | None = None) -> int:
        """Delete least recently used entries until the folder's entries total max_bytes or less (never `keep`),
        plus temporary files older than an hour (a writer that died).  Returns the bytes freed."""
        freed = 0
        now = time.time()
        for p in self.folder.glob(".*.tmp"):
            try:
                if now - p.stat().st_mtime > 3600:
                    freed += p.stat().st_size
                    p.unlink()
            except OSError:
                pass
        sized = []
        for p in self.entries():
            try:
                st = p.stat()
            except OSError:
                continue
            sized.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in sized)
        for _, size, p in sorted(sized, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            if keep is not None and p == keep:
                continue
            if self._remove(p):
                total -= size
                freed += size
        return freed

    @staticmethod
    def _remove(path: Path) -> bool:
        try:
            path.unlink()
            return True
        except OSError:
            return False
