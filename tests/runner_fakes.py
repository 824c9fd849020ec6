"""Fake backends that misbehave inside a runner process, for the supervision tests.

They are loaded in the runner by "module:Class" (RunnerBackend(backend="tests.runner_fakes:CrashingFake"), or
HEARTH_BACKEND_CLASS for the CLI), so what they do to their process is real: a SIGSEGV kills the runner, a
SIGSTOP freezes it.  What they do is chosen by the prompt, so one runner serves good and bad requests:

- a prompt containing "CRASH" kills the runner with SIGSEGV after two tokens; "CRASH-NOW" before any token;
- a prompt containing "HANG" freezes the runner (SIGSTOP) after two tokens;
- HEARTH_FAKE_TOKEN_DELAY (seconds) slows every token, so requests overlap.

EmbeddingFake also tokenizes and embeds, each call taking HEARTH_FAKE_CALL_DELAY seconds, so that a runner killed
from outside dies with calls in flight.

ExtraBuftsCrashFake crashes with SIGSEGV at its first token whenever LoadOptions.extra_bufts is not False, like
llama.cpp's AMX repack path on the machines that hit it, and works otherwise.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

from backends.api import Capabilities, EventKind, GenerationEvent, Request
from tests.fakes import FakeBackend

REPLY = "one two three four five six seven eight"


def _die(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(5)  # SIGSTOP returns only when continued; SIGSEGV never returns


class CrashingFake(FakeBackend):
    name = "crashing-fake"

    def __init__(self, spec=None, options=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(
            spec, options, replies=[REPLY], token_delay_s=float(os.environ.get("HEARTH_FAKE_TOKEN_DELAY", "0") or 0)
        )

    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        with self._serial:  # one request at a time, like llama.cpp: the others wait in the runner, unstarted
            yield from self._stream(request)

    def _stream(self, request: Request) -> Iterator[GenerationEvent]:
        prompt = request.prompt or ""
        if "CRASH-NOW" in prompt:
            _die(signal.SIGSEGV)
        tokens = 0
        for event in super().stream(request):
            if event.kind is EventKind.TOKEN:
                tokens += 1
                if tokens == 3 and "CRASH" in prompt:
                    _die(signal.SIGSEGV)
                if tokens == 3 and "HANG" in prompt:
                    _die(signal.SIGSTOP)
            yield event


class ExtraBuftsCrashFake(CrashingFake):
    name = "extra-bufts-fake"
    capabilities = Capabilities(logits=False, extra_bufts=True)

    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        for event in super().stream(request):
            if event.kind is EventKind.TOKEN and self.options.extra_bufts is not False:
                _die(signal.SIGSEGV)
            yield event


class RefusingFake(CrashingFake):
    """Refuses a prompt whose text is "anything" as too long, before STARTED, like a real backend."""

    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        from backends.errors import ContextOverflowError

        if request.prompt == "anything":
            raise ContextOverflowError("the prompt is 9000 tokens but the context is 2048", "shorten it")
        yield from super().stream(request)


class CrashOnLoadFake(CrashingFake):
    def load(self, progress=None) -> None:  # type: ignore[no-untyped-def]
        _die(signal.SIGSEGV)


class CrashOnSecondLoadFake(CrashingFake):
    """Loads, then crashes (SIGSEGV) on its second load only: a restart's load that fails once.  The loads are
    counted in the file HEARTH_FAKE_LOADS names (each runner is a new process)."""

    def load(self, progress=None) -> None:  # type: ignore[no-untyped-def]
        path = os.environ["HEARTH_FAKE_LOADS"]
        n = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
        with open(path, "w") as f:
            f.write(str(n))
        if n == 2:
            _die(signal.SIGSEGV)
        super().load(progress)


class GpuOomFake(CrashingFake):
    """Runs out of GPU memory at load with more than 8 layers on the GPU (a typed OutOfMemoryError, as the torch
    engine raises for a CUDA OOM), and loads with 8 or fewer."""

    def load(self, progress=None) -> None:  # type: ignore[no-untyped-def]
        from backends.errors import OutOfMemoryError

        if self.options.n_gpu_layers < 0 or self.options.n_gpu_layers > 8:
            raise OutOfMemoryError(f"CUDA out of memory with {self.options.n_gpu_layers} layers on the GPU")
        super().load(progress)


class UnsupportedOnLoadFake(CrashingFake):
    """Refuses its model at load (a typed UnsupportedArchitectureError, as an engine refuses a file it cannot run)."""

    def load(self, progress=None) -> None:  # type: ignore[no-untyped-def]
        from backends.errors import UnsupportedArchitectureError

        raise UnsupportedArchitectureError("fake refuses architecture 'nope'", "use another backend")


class EmbeddingFake(CrashingFake):
    """CrashingFake that embeds too: each input's vector is made from its token ids (the same ids, the same
    vector), and every tokenize and embed takes HEARTH_FAKE_CALL_DELAY seconds; tokenizing a text containing
    "CRASH-CALL" kills the runner."""

    name = "embedding-fake"
    capabilities = Capabilities(logits=False, embeddings=True)

    def _call_delay(self) -> None:
        time.sleep(float(os.environ.get("HEARTH_FAKE_CALL_DELAY", "0") or 0))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._call_delay()
        if "CRASH-CALL" in text:  # a call that kills its runner every time
            _die(signal.SIGSEGV)
        return super().tokenize(text, add_special, parse_special)

    def embed(self, inputs):  # type: ignore[no-untyped-def]
        import numpy as np

        self._call_delay()
        out = np.zeros((len(inputs), self.spec.hidden_size), dtype=np.float32)
        for row, ids in zip(out, inputs):
            for i, t in enumerate(ids):
                row[(t + i) % len(row)] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)
