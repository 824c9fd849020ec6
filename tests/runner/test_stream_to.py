"""RunnerBackend.stream_to (the API server's way to stream without a thread per request) against a real runner
process: concurrent streams each get their events complete and in order (the runner sends several streams' events
in one Events frame); a crash ends a stream with its error as the last item, or the exception stream() raises."""

from __future__ import annotations

import threading

from backends.api import EventKind, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import RunnerCrashedError
from backends.runner.client import RunnerBackend
from tests.fakes import fake_spec
from tests.runner_fakes import REPLY

FAKE = "tests.fakes:FakeBackend"


def _collect(backend: RunnerBackend, prompt: str) -> tuple[list, threading.Event]:
    items: list = []
    done = threading.Event()

    def sink(item) -> None:  # type: ignore[no-untyped-def]
        items.append(item)
        if isinstance(item, BaseException) or item.kind is EventKind.FINISHED:
            done.set()

    backend.stream_to(Request(prompt=prompt, sampling=SamplingParams(max_tokens=50)), sink)
    return items, done


def test_concurrent_streams_arrive_whole_and_in_order(tmp_path) -> None:
    b = RunnerBackend(
        fake_spec(path=str(tmp_path / "fake.gguf")), LoadOptions(n_ctx=2048), backend=FAKE, log_dir=tmp_path / "logs"
    )
    b.load()
    try:
        streams = [_collect(b, f"prompt {i}") for i in range(8)]
        for items, done in streams:
            assert done.wait(30)
            kinds = [e.kind for e in items]
            assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.FINISHED
            assert set(kinds[1:-1]) == {EventKind.TOKEN} and items[-1].finish_reason is FinishReason.STOP
            text = "".join(e.text for e in items if e.kind is EventKind.TOKEN)
            assert text == "Hello from the fake backend."
        assert not b._streams  # every finished stream let go of its state
    finally:
        b.close()


def test_a_crash_is_the_last_item(tmp_path) -> None:
    b = RunnerBackend(
        fake_spec(path=str(tmp_path / "fake.gguf")),
        LoadOptions(n_ctx=2048),
        backend="tests.runner_fakes:CrashingFake",
        log_dir=tmp_path / "logs",
    )
    b.load()
    try:
        items, done = _collect(b, "CRASH after two")  # two tokens shown, then SIGSEGV: cut off, with the reason
        assert done.wait(60)
        assert [e.text for e in items if e.kind is EventKind.TOKEN] == REPLY.split(" ")[:1] + [" two"]
        assert items[-1].finish_reason is FinishReason.ERROR and items[-1].error_code == "runner_crashed"
        items, done = _collect(b, "CRASH-NOW")  # nothing shown, sent once more, crashes again: the exception
        assert done.wait(60)
        assert len(items) == 1 and isinstance(items[0], RunnerCrashedError) and "SIGSEGV" in str(items[0])
        assert b.generate(Request(prompt="fine")).finish_reason is FinishReason.STOP
    finally:
        b.close()
