"""Messages the workers post to the App (they are the only way engine results reach the UI, STYLE rule 10)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from app.loaded import Loaded
from backends.api import Description, RequestStats


@dataclass
class LoadProgress(Message):
    fraction: float  # 0..1
    what: str  # what the loader is doing


@dataclass
class ModelReady(Message):
    loaded: Loaded
    describe: Description  # backend.describe(), read in the worker
    memory: dict[str, int]  # backend.memory_in_use()


@dataclass
class ModelFailed(Message):
    model: str | None  # what we tried to load
    error: str  # one line


@dataclass
class ReplyChunk(Message):
    turn_id: int
    text: str  # new text since the previous chunk (several tokens batched together)


@dataclass
class ReplyDone(Message):
    turn_id: int
    finish_reason: str  # FinishReason value
    stats: RequestStats | None
    error: str | None  # FinishReason.ERROR: one line
    memory: dict[str, int]  # backend.memory_in_use() after the reply
    error_code: str | None = None  # GenerationEvent.error_code: "runner_crashed" when the model's process died


@dataclass
class ReplyFailed(Message):
    turn_id: int
    error: str  # one line: the request was refused (context overflow, OOM, bad settings) before any text


@dataclass
class RunnerNotice(Message):
    text: str  # what the runner supervisor did: a crash, a restart, a safer configuration
