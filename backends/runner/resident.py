"""Resident runners: a runner that outlives the command that loaded it, for its keep-alive time.

`import torch` alone takes longer (~1.1 s) than llama.cpp's whole `hearth run` (issue 24), so no fresh process can
start the torch engine as fast.  Ollama never starts one per command: its server keeps the model loaded for
`keep_alive` (5 minutes) after the last request.  hearth does the same without a server: when `hearth run` or
the chat app ends, its runner stays (lingers) for `keep_alive` with the model loaded, listening on a Unix socket
of its own; the next command that would send it the very same Load message (same engine, model file, plan,
options and hearth code) connects and sends its requests there, and no interpreter, import or load runs again.

The socket's file name holds the key: `<backend>-<model>-<load>-<pid>.sock`, `<load>` a hash of the encoded Load
message and of hearth's own source files (a runner of other code never serves a newer hearth).  One runner per
key lingers: a command whose load already has one ends its own runner instead.  A listening
runner accepts one connection, removes its socket file and serves that command as if it had started it; when
its time runs out with nobody connecting, it exits.  Beside the socket, `<name>.json` says what it holds (for
`hearth ps`).  A resident whose key does not match is ended before a plan (its memory would skew what the plan
sees free) or before a runner starts (`evict`): what the plan promises is still what is allocated.

Security: the folder is the user's own (mode 0700, checked: a folder someone else made is never used), the socket
0600, and each side checks the other's uid (SO_PEERCRED).  Linux only; elsewhere `resident_dir` is None and
runners exit with their command, as before.  Standard library only at import (`hearth run` lists residents
before it imports the rest), the runner protocol where a socket is spoken to.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.atomic_write import write_text_atomically

if TYPE_CHECKING:
    from backends.runner import protocol as p

log = logging.getLogger(__name__)

SUFFIX = ".sock"
HANDSHAKE_TIMEOUT_S = 5.0  # a resident answers a connection at once; one that does not is closing
EVICT_TIMEOUT_S = 10.0  # an evicted resident frees its memory by exiting; wait this long for it
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux
_PEERCRED = struct.Struct("3i")
_WAIT_SLICE_S = 3600.0  # a listening runner wakes at least this often (a keep-alive of any size is then just a loop)


def resident_dir(data_dir: Path) -> Path | None:
    """The folder of this hearth home's resident runners, or None where there can be none (no Unix sockets with
    peer credentials, a path too long, a folder that is not the user's own).  Not made here (`make_private`
    makes it when a runner first lingers): commands that find no folder find no residents."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "SO_PEERCRED") or not hasattr(os, "getuid"):
        return None
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    root = (
        Path(runtime) / "hearth"
        if runtime and os.path.isdir(runtime)
        else Path(tempfile.gettempdir()) / f"hearth-{os.getuid()}"
    )
    # one folder per hearth home (HEARTH_HOME): tests and portable installs never meet another's runners
    folder = root / hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    if len(str(folder)) + 64 > _MAX_SOCKET_PATH:
        return None
    for d in (root, folder):
        if not _private(d, missing_ok=True):
            return None
    return folder


def make_private(folder: Path) -> bool:
    """Make `folder` (and its parent) mode 0700 if missing; whether both are this user's private folders."""
    for d in (folder.parent, folder):
        try:
            d.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            return False
        if not _private(d, missing_ok=False):
            return False
    return True


def _private(d: Path, missing_ok: bool) -> bool:
    try:
        st = d.lstat()
    except FileNotFoundError:
        return missing_ok
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("not using %s for resident runners: it is not a private folder of this user", d)
        return False
    return True


def code_stamp() -> str:
    """What identifies hearth's code here: the interpreter and every source file of the packages a runner runs
    (path, size, mtime).  ~250 stats, a few ms; only computed when a runner may linger."""
    h = hashlib.sha256(sys.executable.encode())
    root = Path(__file__).resolve().parents[2]
    for package in ("backends", "kernels", "hwprobe"):
        for path in sorted((root / package).rglob("*.py")):
            try:
                st = path.stat()
            except OSError:
                continue
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _slug(text: str, n: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)[:n] or "x"


def load_stem(load: p.Load, stamp: str) -> str:
    """The start of the socket name of every runner holding exactly `load` (the key); each one's socket is
    `<stem>-<pid>.sock`, so a second runner lingering with the same load never takes the first one's name."""
    from backends.runner import protocol as p  # lazy: heavy: msgspec and the contract (prestart lists residents)

    body = p.encode(load)
    key = hashlib.sha256(stamp.encode() + b"\0" + body).hexdigest()[:16]
    return f"{_slug(load.backend, 24)}-{model_tag(load.spec.path)}-{key}"


def model_tag(model_path: str) -> str:
    return hashlib.sha256(str(model_path).encode()).hexdigest()[:8]


def peer_uid_pid(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid, pid


@dataclass(frozen=True)
class Attached:
    """A resident's connection as its new owner holds it: the socket after the handshake, the runner's pid and
    its log."""

    sock: socket.socket
    pid: int
    log_path: Path


def attach(path: Path) -> Attached | None:
    """Connect to the resident listening at `path` and take it over; None when there is none (a stale socket
    file is removed) or it did not answer (another command took it first)."""
    from backends.runner import protocol as p  # lazy: heavy: msgspec and the contract (prestart lists residents)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        sock.connect(str(path))
        uid, pid = peer_uid_pid(sock)
        hello = p.Channel(sock, p.FromRunner).recv() if uid == os.getuid() else None  # never another user's
    except FileNotFoundError:
        sock.close()
        return None
    except ConnectionRefusedError:  # nobody listens: the runner died without removing its socket
        sock.close()
        _remove(path)
        return None
    except (OSError, p.ProtocolError):
        sock.close()
        return None
    if not isinstance(hello, p.Resumed):
        sock.close()
        return None
    sock.settimeout(None)
    return Attached(sock, pid, Path(hello.log_path))


def _remove(path: Path) -> None:
    for q in (path, path.with_suffix(".json")):
        with contextlib.suppress(OSError):
            q.unlink()


@dataclass(frozen=True)
class Resident:
    """A lingering runner as `hearth ps` shows it."""

    path: Path
    backend: str
    model: str
    pid: int
    since: float  # when it began to linger (time.time())
    until: float | None  # when it exits if nobody connects; None: never

    @property
    def model_tag(self) -> str:
        return self.path.name.split("-")[-3]

    @property
    def stem(self) -> str:
        """The name without its pid (load_stem)."""
        return self.path.name.rsplit("-", 1)[0]


def residents(folder: Path | None) -> list[Resident]:
    """The runners lingering in `folder`, oldest first (a socket without its description is listed by name)."""
    if folder is None:
        return []
    found = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = folder / name
        try:
            info = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = {}
        if not isinstance(info, dict):
            info = {}
        until = info.get("until")
        found.append(
            Resident(
                path,
                str(info.get("backend", name.split("-")[0])),
                str(info.get("model", "?")),
                int(info.get("pid", 0) or 0),
                float(info.get("since", 0) or 0),
                float(until) if isinstance(until, (int, float)) else None,
            )
        )
    return sorted(found, key=lambda r: r.since)


def evict(resident: Resident | Path) -> bool:
    """End a lingering runner and wait until it has exited (its memory is back); True if one was ended."""
    path = resident.path if isinstance(resident, Resident) else resident
    from backends.runner import protocol as p  # lazy: heavy: msgspec and the contract (prestart lists residents)

    attached = attach(path)
    if attached is None:
        return False
    channel = p.Channel(attached.sock, p.FromRunner)
    try:
        channel.send(p.Close())
        attached.sock.settimeout(EVICT_TIMEOUT_S)
        while channel.recv() is not None:  # Closed, then the end of the socket when the process is gone
            pass
    except (OSError, p.ProtocolError):
        pass
    finally:
        attached.sock.close()
    wait_gone(attached.pid, EVICT_TIMEOUT_S)
    return True


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, not yet reaped by its parent: a test's runner) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, timeout_s: float | None) -> bool:
    """Wait until `pid` has exited (None: no limit); whether it did."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while process_alive(pid):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def evict_all(folder: Path | None, keep_model: str | None = None) -> int:
    """End every lingering runner in `folder` except those holding the model file `keep_model`; how many."""
    ended = 0
    for r in residents(folder):
        if keep_model is not None and r.model_tag == model_tag(keep_model):
            continue
        ended += evict(r)
    return ended


# -- the runner's side ----------------------------------------------------------------------------------------
def describe_file(path: Path, backend: str, model: str, seconds: float | None) -> None:
    now = time.time()
    info = {
        "pid": os.getpid(),
        "backend": backend,
        "model": model,
        "since": now,
        "until": None if seconds is None else now + seconds,
    }
    with contextlib.suppress(OSError):
        write_text_atomically(path.with_suffix(".json"), json.dumps(info))


@contextlib.contextmanager
def listening(path: Path) -> Iterator[socket.socket]:
    """A listening socket at `path` (mode 0600), removed with its description when the block ends."""
    _remove(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    inode = os.stat(path).st_ino
    try:
        listener.listen(8)
        yield listener
    finally:
        listener.close()  # connections still queued are refused: their owners start runners of their own
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:  # never another runner's socket made since
                _remove(path)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the last one leaves no folder behind (one that still holds a runner stays)


def wait_for_owner(listener: socket.socket, seconds: float | None) -> socket.socket | None:
    """The next connection of this user within `seconds` (None: no limit); None when the time ran out."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        listener.settimeout(_WAIT_SLICE_S if left is None else min(left, _WAIT_SLICE_S))  # any keep-alive, even 1e12 s
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return None
        try:
            uid, _pid = peer_uid_pid(conn)
        except OSError:
            uid = -1
        if uid == os.getuid():
            conn.settimeout(None)
            return conn
        conn.close()
