"""llama.cpp hands its one context to a request of a better priority (backends/llama_cpp/turns.py), on the real
starter: a chat sent while a long background stream decodes, or while a long prompt is evaluated, gets its first
token before the background stream's end (or first token), and both give the same tokens as alone: greedy, and
sampled with a seed (the parked KV cells and sampler come back as they were)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from backends.api import EventKind, LoadOptions, Request, SamplingParams
from backends.modelspec import load_spec
from backends.templates import render_for_spec

pytestmark = pytest.mark.e2e

COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"


@pytest.fixture(scope="module")
def backend(starter_path: Path):
    from backends.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=1024, n_batch=64, n_threads=2))
    b.load()
    yield b
    b.close()


def _chat(backend, priority: int) -> Request:
    r = render_for_spec(backend.spec, [{"role": "user", "content": "What is the capital of France?"}])
    sp = SamplingParams(temperature=0, max_tokens=12)
    return Request(prompt=r.text, add_special=r.add_special, sampling=sp, priority=priority)


def _background(prompt: str, n: int, **sampling) -> Request:
    sp = SamplingParams(**({"temperature": 0} | sampling), max_tokens=n, ignore_eos=True)
    return Request(prompt=prompt, sampling=sp, priority=0)


class Timed:
    """A request streamed on its own thread: its token ids, the time of its first token and of its end."""

    def __init__(self, backend, request: Request) -> None:
        self.request, self.ids = request, []
        self.first = self.end = 0.0
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(backend,))
        self.thread.start()

    def _run(self, backend) -> None:
        for e in backend.stream(self.request):
            if e.kind is EventKind.STARTED:
                self.started.set()
            if e.token_ids and not self.first:
                self.first = time.perf_counter()
            self.ids += e.token_ids
        self.end = time.perf_counter()

    def join(self) -> Timed:
        self.thread.join(120)
        assert not self.thread.is_alive()
        return self


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 11}], ids=["greedy", "seeded"])
def test_a_chat_preempts_a_long_stream_and_neither_loses_a_token(backend, sampling) -> None:
    alone_bg = backend.generate(_background(COUNT, 150, **sampling)).token_ids
    alone_chat = backend.generate(_chat(backend, -10)).token_ids
    before = backend.stats().preemptions
    bg = Timed(backend, _background(COUNT, 150, **sampling))
    while len(bg.ids) < 10:
        time.sleep(0.005)
    chat = Timed(backend, _chat(backend, -10)).join()
    bg.join()
    assert chat.end < bg.end  # the chat did not wait for the 150 tokens
    assert backend.stats().preemptions > before
    assert tuple(chat.ids) == alone_chat
    assert tuple(bg.ids) == alone_bg  # its cells and sampler back as they were: the very same tokens


def test_a_chat_goes_between_the_pieces_of_a_long_prompt(backend) -> None:
    long_prompt = " ".join(f"{i}," for i in range(1, 150))  # ~690 tokens: ten 64-token pieces
    assert len(backend.tokenize(long_prompt)) > 600
    alone_bg = backend.generate(_background(long_prompt, 4)).token_ids
    backend.generate(_background("x", 1))  # the long prompt leaves the cache
    bg = Timed(backend, _background(long_prompt, 4))
    bg.started.wait(30)  # its prompt is being evaluated
    chat = Timed(backend, _chat(backend, -10)).join()
    bg.join()
    assert chat.first < bg.first  # the chat's first token came before the long prompt's
    assert tuple(bg.ids) == alone_bg


def test_a_request_that_waited_long_is_not_pushed_back_by_a_slightly_better_one(backend) -> None:
    """As the torch engine's scheduler: a newcomer preempts only when its priority beats the running request's
    priority aged by the time that one waited (here 3 levels: 0.35 s at 0.1 s a level)."""
    backend._serial.aging_s = 0.1
    try:
        backend._serial.acquire(-100)  # the context is busy: the background request queues
        bg = Timed(backend, _background(COUNT, 60))
        time.sleep(0.35)
        backend._serial.release()
        while len(bg.ids) < 5:
            time.sleep(0.005)
        before = backend.stats().preemptions
        slightly = Timed(backend, _chat(backend, -1)).join()
        assert backend.stats().preemptions == before and slightly.first > bg.end  # -1 does not beat 0 aged to -3
        bg.join()
        bg = Timed(backend, _background(COUNT, 60))
        while len(bg.ids) < 5:
            time.sleep(0.005)
        much = Timed(backend, _chat(backend, -10)).join()
        bg.join()
        assert backend.stats().preemptions > before and much.end < bg.end
    finally:
        backend._serial.aging_s = 5.0


def test_a_preempted_request_is_aged_by_its_waiting_not_its_running(backend) -> None:
    """A stream that has run 0.6 s (6 aging levels at 0.1 s) but never waited yields once to a -1 chat and lets it
    finish first.  Ranked in the queue by its arrival it would outrank the chat it yields to (0 aged to -6), take
    the turn straight back and yield again at every token."""
    backend._serial.aging_s = 0.1
    try:
        bg = Timed(backend, _background(COUNT, 150))
        time.sleep(0.6)
        assert bg.ids and not bg.end
        before = backend.stats().preemptions
        chat = Timed(backend, _chat(backend, -1)).join()
        bg.join()
        assert backend.stats().preemptions == before + 1 and chat.end < bg.end
    finally:
        backend._serial.aging_s = 5.0
