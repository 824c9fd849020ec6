"""The typed messages between hearth and a runner process, and their framing on a socket.

Every message is a msgspec Struct tagged with its kind, so a frame decodes straight into the right type (no
tuples, no dicts with a "type" key).  The payloads are the Backend contract's own dataclasses (ModelSpec,
LoadOptions, Request, GenerationEvent, EngineStats): what crosses the process boundary is exactly what the
in-process contract passes.

Framing: an 8-byte little-endian length, then a msgpack body.  A frame over MAX_FRAME_BYTES is a protocol
error (the largest real message is a logits block: positions x vocab x 4 bytes, 512 MiB for a 512-token window
of a 262,144-token vocabulary).
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Generic, TypeVar

import msgspec

import backends.errors as errors
from backends.api import EngineStats, GenerationEvent, LoadOptions, Request
from backends.describe import WireFact
from backends.kernel_report import KernelReport
from backends.modelspec import ModelSpec

MAX_FRAME_BYTES = 4 << 30
_HEADER = struct.Struct("<Q")


class ErrorInfo(msgspec.Struct, frozen=True):
    """An exception raised in the runner: its class name (HearthError subclasses are raised again as the same
    class in hearth's process), its one-line message and its hint."""

    type: str
    message: str
    hint: str | None = None


# -- hearth -> runner -----------------------------------------------------------------------------------------
class Load(msgspec.Struct, tag="load", frozen=True):
    backend: str  # registry name, or "module:Class" for a backend outside the registry (tests, plugins)
    spec: ModelSpec
    options: LoadOptions


class Stream(msgspec.Struct, tag="stream", frozen=True):
    request: Request


class Abort(msgspec.Struct, tag="abort", frozen=True):
    request_id: str


class Tokenize(msgspec.Struct, tag="tokenize", frozen=True):
    call_id: int
    text: str
    add_special: bool = True
    parse_special: bool = True


class Detokenize(msgspec.Struct, tag="detokenize", frozen=True):
    call_id: int
    token_ids: list[int]


class Logits(msgspec.Struct, tag="logits", frozen=True):
    call_id: int
    token_ids: list[int]


class Embed(msgspec.Struct, tag="embed", frozen=True):
    """Backend.embed(inputs): answered with an ArrayReply (len(inputs), hidden)."""

    call_id: int
    inputs: list[list[int]]


class Describe(msgspec.Struct, tag="describe", frozen=True):
    call_id: int


class Stats(msgspec.Struct, tag="stats", frozen=True):
    call_id: int


class KernelReportCall(msgspec.Struct, tag="kernel_report", frozen=True):
    """The engine's kernel self-check report for `hearth doctor` (registry BackendInfo.kernel_report), asked of a
    runner that loaded no model: answered with a KernelReportReply."""

    call_id: int
    backend: str  # registry name
    spec: ModelSpec
    record: str  # the kernel self-check record's path
    check_now: bool  # check every kernel now (`hearth doctor --kernels`), else only read the record


class Close(msgspec.Struct, tag="close", frozen=True):
    pass


class Linger(msgspec.Struct, tag="linger", frozen=True):
    """Stay loaded after this owner leaves: listen at `path` for the next command for `seconds` (None: no limit),
    then exit (backends/runner/resident.py).  Answered with Lingering, after which the owner closes its end."""

    seconds: float | None
    path: str
    log_path: str  # the runner's log, told to its next owner (Resumed)
    model: str  # the model's name as the user knows it (`hearth ps`)


# -- runner -> hearth -----------------------------------------------------------------------------------------
class Heartbeat(msgspec.Struct, tag="heartbeat", frozen=True):
    pid: int  # sent every HEARTBEAT_S by its own thread, so a frozen runner is told from a busy one


class Progress(msgspec.Struct, tag="progress", frozen=True):
    fraction: float  # 0..1
    what: str


class Loaded(msgspec.Struct, tag="loaded", frozen=True):
    n_ctx: int
    describe: dict[str, WireFact]  # Backend.describe() as its flat mapping (backends/describe.py)


class LoadFailed(msgspec.Struct, tag="load_failed", frozen=True):
    error: ErrorInfo


class Event(msgspec.Struct, tag="event", frozen=True):
    event: GenerationEvent


class Events(msgspec.Struct, tag="events", frozen=True):
    """Events of several streams at once (one engine step's tokens): one frame, one wake-up of hearth's reader,
    instead of one each."""

    events: list[GenerationEvent]


class StreamFailed(msgspec.Struct, tag="stream_failed", frozen=True):
    """stream() raised before its STARTED event (prompt too long, bad request): nothing ran."""

    request_id: str
    error: ErrorInfo


class TokensReply(msgspec.Struct, tag="tokens_reply", frozen=True):
    call_id: int
    token_ids: list[int]


class TextReply(msgspec.Struct, tag="text_reply", frozen=True):
    call_id: int
    text: str


class ArrayReply(msgspec.Struct, tag="array_reply", frozen=True):
    """A float32 array, C order."""

    call_id: int
    shape: list[int]
    data: bytes


class DescribeReply(msgspec.Struct, tag="describe_reply", frozen=True):
    call_id: int
    describe: dict[str, WireFact]


class StatsReply(msgspec.Struct, tag="stats_reply", frozen=True):
    call_id: int
    stats: EngineStats


class KernelReportReply(msgspec.Struct, tag="kernel_report_reply", frozen=True):
    call_id: int
    report: KernelReport


class CallFailed(msgspec.Struct, tag="call_failed", frozen=True):
    call_id: int
    error: ErrorInfo


class Closed(msgspec.Struct, tag="closed", frozen=True):
    pass


class Lingering(msgspec.Struct, tag="lingering", frozen=True):
    """Linger taken: the runner no longer writes to this owner's socket."""


class Resumed(msgspec.Struct, tag="resumed", frozen=True):
    """A lingering runner's first message to a command that connected to it."""

    pid: int
    log_path: str


ToRunner = (
    Load | Stream | Abort | Tokenize | Detokenize | Logits | Embed | Describe | Stats | KernelReportCall | Close
) | Linger
FromRunner = (
    Heartbeat
    | Progress
    | Loaded
    | LoadFailed
    | Event
    | Events
    | StreamFailed
    | TokensReply
    | TextReply
    | ArrayReply
    | DescribeReply
    | StatsReply
    | KernelReportReply
    | CallFailed
    | Closed
    | Lingering
    | Resumed
)
Reply = TokensReply | TextReply | ArrayReply | DescribeReply | StatsReply | KernelReportReply | CallFailed


def _enc_hook(obj: Any) -> Any:
    """numpy scalars and arrays in GGUF metadata become plain Python values."""
    tolist = getattr(obj, "tolist", None)
    if tolist is not None:
        return tolist()
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to a runner")


def encode(message: ToRunner | FromRunner) -> bytes:
    """A message's body as a Channel sends it (backends/runner/resident.py hashes a Load with it)."""
    return msgspec.msgpack.encode(message, enc_hook=_enc_hook)


class ProtocolError(Exception):
    """A frame that does not decode, or a peer that broke the framing."""


_In = TypeVar("_In", ToRunner, FromRunner)


class Channel(Generic[_In]):
    """One end of the socket: send() from any thread (callers hold their own lock), recv() from one.
    `incoming`: the union this end decodes (ToRunner in the runner, FromRunner in hearth)."""

    def __init__(self, sock: socket.socket, incoming: type[_In]) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
        self._decoder = msgspec.msgpack.Decoder(incoming)

    def send(self, message: ToRunner | FromRunner) -> None:
        body = self._encoder.encode(message)
        if len(body) < 1 << 16:  # one write for the common small message
            self.sock.sendall(_HEADER.pack(len(body)) + body)
        else:  # no copy of a large body (logits)
            self.sock.sendall(_HEADER.pack(len(body)))
            self.sock.sendall(body)

    def recv(self) -> _In | None:
        """The next message; None at a clean end of stream (the peer closed or died)."""
        header = self._read(_HEADER.size)
        if header is None:
            return None
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise ProtocolError(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")
        body = self._read(size)
        if body is None:
            return None
        try:
            return self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"a frame did not decode: {exc}") from None

    def _read(self, n: int) -> bytearray | None:
        buf = bytearray(n)  # decoded in place: a large frame (logits) is never copied whole once more
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                return None
            got += k
        return buf


def error_info(exc: BaseException) -> ErrorInfo:
    """What crosses the boundary of an exception: its class name, message and hint."""
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return ErrorInfo(type(exc).__name__, message.splitlines()[0] if message else "", getattr(exc, "hint", None))


def raise_error(info: ErrorInfo) -> None:
    """Raise the HearthError subclass the runner raised (same class, message and hint); anything else becomes
    a RunnerError that names the original type."""
    cls = getattr(errors, info.type, None)
    if isinstance(cls, type) and issubclass(cls, errors.HearthError):
        raise cls(info.message, info.hint)
    raise errors.RunnerError(f"the runner failed: {info.type}: {info.message}", info.hint)
