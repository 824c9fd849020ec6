"""RunnerBackend.unload (what keep_alive uses): the runner process ends, and the next call, from any thread,
starts one again with the same configuration; an unload while something runs is refused."""

from __future__ import annotations

import threading

import psutil

from backends.api import LoadOptions, Request, SamplingParams
from backends.runner.client import RunnerBackend
from tests.fakes import fake_spec


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _live_runners() -> int:
    """This process's live runner children; a zombie left by an earlier test (killed, not yet reaped) has no
    command line to read and is not a runner that holds memory."""
    n = 0
    for c in psutil.Process().children():
        try:
            n += "backends.runner.child" in " ".join(c.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return n


def test_unload_ends_the_runner_and_the_next_calls_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    b = RunnerBackend(
        fake_spec(path=str(tmp_path / "fake.gguf")),
        LoadOptions(n_ctx=2048),
        backend="tests.runner_fakes:CrashingFake",
        log_dir=tmp_path / "logs",
    )
    b.load()
    first = b.pid
    assert b.resident and b.unload() and not b.resident and b.pid is None
    assert _gone(first)
    assert b.stats().rss_bytes == 0  # /metrics while unloaded loads nothing
    assert b.describe()["runner_pid"] is None

    # several threads need it at once: one runner starts, every caller gets its answer
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(b.generate(Request(prompt="hi")).text)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and b.resident and b.pid not in (None, first)
    assert _live_runners() == 1

    # load() after unload starts it again in the caller's thread (keep_alive times this as load_duration)
    assert b.unload()
    b.load()
    assert b.resident and b.tokenize("ab") == [97, 98]

    # not while a stream runs
    stream = b.stream(Request(prompt="hello", sampling=SamplingParams(max_tokens=50)))
    next(stream)
    assert not b.unload()
    list(stream)
    b.close()
    assert not b.unload()  # closed: nothing to unload
