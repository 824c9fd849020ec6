"""A full disk for a moment, for `hearth bench --soak --chaos` (issue 43 item 2): every free block of the filesystem
under a directory taken by one file, then given back.

The file is unlinked as soon as it is opened (O_TMPFILE), so its blocks return to the filesystem when the
descriptor closes, however this process ends: a soak killed mid-fill leaves no full disk behind.  Blocks are taken
with fallocate(2), which reserves them without writing, in a few calls whatever the size; a filesystem without it
(where glibc's posix_fallocate would write every byte) is not filled, and neither is a tmpfs, whose blocks are RAM.
As root the filesystem's reserved blocks are taken too (root may write into them), so the disk is full for every
process, as it would be.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

_RAM_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}
_MIN_PIECE = 4096


def fill_refusal(directory: Path) -> str | None:
    """Why the filesystem under `directory` is not filled (None: it may be)."""
    fstype = _fstype(directory)
    if fstype in _RAM_FILESYSTEMS:
        return f"{directory} is on {fstype}: its blocks are memory"
    if _libc_fallocate() is None:
        return "this C library has no fallocate()"
    return None


class DiskFill:
    """`with DiskFill(directory) as fill:` the filesystem holding `directory` has no free block left until the
    block ends (`fill.taken` bytes were taken).  Raises OSError when fallocate is not supported there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.taken = 0
        self._fd: int | None = None

    def __enter__(self) -> DiskFill:
        self._fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR, 0o600)
        try:
            self.taken = _take_everything(self._fd, os.statvfs(self.directory))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # an unlinked file: its blocks go back now
            self._fd = None


def _take_everything(fd: int, st: os.statvfs_result) -> int:
    """fallocate pieces, halving on ENOSPC, until not even _MIN_PIECE fits; the bytes taken."""
    fallocate = _libc_fallocate()
    if fallocate is None:
        raise OSError(errno.EOPNOTSUPP, "no fallocate() in this C library")
    offset = 0
    piece = max(st.f_bfree * st.f_frsize, _MIN_PIECE)  # f_bfree: the reserved blocks too, which root may use
    while piece >= _MIN_PIECE:
        if fallocate(fd, 0, ctypes.c_int64(offset), ctypes.c_int64(piece)) == 0:
            offset += piece
            continue
        code = ctypes.get_errno()
        if code not in (errno.ENOSPC, errno.EFBIG):
            raise OSError(code, f"fallocate: {os.strerror(code)}")
        piece //= 2
    return offset


def _libc_fallocate():  # type: ignore[no-untyped-def]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    fn = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int
    return fn


def _fstype(path: Path) -> str:
    """The type of the filesystem mounted closest above `path` (/proc/self/mounts; "" when unknown)."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, fields[2]
    return fstype
