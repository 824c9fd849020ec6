"""Runner processes: a model's engine runs in a child process; a crash or a hang there costs the requests in
flight, never hearth.  These tests run real runner processes with the fakes of tests/runner_fakes.py."""

from __future__ import annotations

import json
import os
import threading
import time

import psutil
import pytest

from backends.api import EventKind, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import ContextOverflowError, RunnerCrashedError
from backends.runner.client import RunnerBackend
from backends.runner.memory import ConfigMemory
from tests.fakes import fake_spec

CRASHING = "tests.runner_fakes:CrashingFake"
EXTRA_BUFTS = "tests.runner_fakes:ExtraBuftsCrashFake"


def _backend(tmp_path, name=CRASHING, **kw):  # type: ignore[no-untyped-def]
    b = RunnerBackend(
        fake_spec(path=str(tmp_path / "fake.gguf")),
        LoadOptions(n_ctx=2048),
        backend=name,
        log_dir=tmp_path / "logs",
        **kw,
    )
    return b


def _events(backend, prompt):  # type: ignore[no-untyped-def]
    return list(backend.stream(Request(prompt=prompt, sampling=SamplingParams(max_tokens=50))))


def test_stream_calls_and_close_through_a_runner(tmp_path):
    b = _backend(tmp_path)
    progress: list[float] = []
    b.load(lambda f, what: progress.append(f))
    assert progress[-1] == 1.0 and len(progress) >= 4  # progress reported by the runner while it loads
    pid = b.pid
    assert pid is not None and pid != os.getpid()
    result = b.generate(Request(prompt="hello"))
    assert result.text == "one two three four five six seven eight" and result.finish_reason is FinishReason.STOP
    assert b.tokenize("ab") == [97, 98] and b.detokenize([104, 105]) == "hi"
    assert b.describe()["runner_pid"] == pid and b.n_ctx == 2048
    assert b.stats().rss_bytes > 0
    b.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    b.close()  # idempotent


def test_errors_before_started_keep_their_type(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    b = _backend(tmp_path, name="tests.runner_fakes:RefusingFake")
    b.load()
    with pytest.raises(ContextOverflowError, match="9000 tokens"):
        _events(b, "anything")
    assert b.generate(Request(prompt="fine")).finish_reason is FinishReason.STOP  # the runner is still there
    b.close()


def test_sigsegv_mid_stream_costs_that_reply_and_a_new_runner_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0.02")
    b = _backend(tmp_path)
    b.load()
    notices: list[str] = []
    b.on_notice = notices.append
    first_pid = b.pid
    assert b.generate(Request(prompt="warm up")).finish_reason is FinishReason.STOP
    events = _events(b, "please CRASH")
    last = events[-1]
    assert last.kind is EventKind.FINISHED and last.finish_reason is FinishReason.ERROR
    assert last.error_code == "runner_crashed"
    assert "SIGSEGV" in last.error and "while generating" in last.error and "2 tokens in" in last.error
    assert [e.text for e in events if e.kind is EventKind.TOKEN] == ["one", " two"]  # what it streamed stays
    after = b.generate(Request(prompt="and now?"))
    assert after.finish_reason is FinishReason.STOP and after.text.startswith("one two")
    assert b.pid not in (None, first_pid)
    assert any("SIGSEGV" in n for n in notices) and any("is ready" in n for n in notices)
    b.close()


def test_a_concurrent_request_with_no_text_yet_is_replayed_on_the_new_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0.05")
    b = _backend(tmp_path)  # a serialising backend: the second request waits in the runner, unstarted
    b.load()
    assert b.generate(Request(prompt="warm up")).finish_reason is FinishReason.STOP
    results: dict[str, object] = {}

    def run(name: str, prompt: str) -> None:
        results[name] = b.generate(Request(prompt=prompt))

    victim = threading.Thread(target=run, args=("victim", "CRASH here"))
    victim.start()
    time.sleep(0.05)
    other = threading.Thread(target=run, args=("other", "innocent"))
    other.start()
    victim.join(30)
    other.join(30)
    assert results["victim"].finish_reason is FinishReason.ERROR  # type: ignore[attr-defined]
    assert results["other"].finish_reason is FinishReason.STOP  # type: ignore[attr-defined]
    assert results["other"].text.startswith("one two three")  # type: ignore[attr-defined]
    b.close()


def test_a_frozen_runner_is_killed_after_the_heartbeat_timeout(tmp_path, monkeypatch):
    b = _backend(tmp_path, hang_timeout_s=1.5)
    b.load()
    assert b.generate(Request(prompt="warm up")).finish_reason is FinishReason.STOP
    start = time.monotonic()
    last = _events(b, "HANG now")[-1]
    assert time.monotonic() - start < 15
    assert last.finish_reason is FinishReason.ERROR and "stopped answering for 1.5 s" in last.error
    assert b.generate(Request(prompt="again")).finish_reason is FinishReason.STOP
    b.close()


def test_crash_before_any_token_without_replay_left_raises_one_line(tmp_path):
    b = _backend(tmp_path)
    b.load()
    with pytest.raises(RunnerCrashedError, match="SIGSEGV"):
        _events(b, "CRASH-NOW")  # sent once more after the first crash, crashes again: then it fails
    assert b.generate(Request(prompt="fine")).finish_reason is FinishReason.STOP
    b.close()


def test_ladder_turns_extra_bufts_off_and_remembers_it(tmp_path):
    memory = ConfigMemory(tmp_path / "configs.json", "machine-1")
    b = _backend(tmp_path, name=EXTRA_BUFTS, memory=memory)
    b.load()
    notices: list[str] = []
    b.on_notice = notices.append
    result = b.generate(Request(prompt="hello"))  # crashes at the first token, replayed without extra bufts
    assert result.finish_reason is FinishReason.STOP and result.text.startswith("one two")
    assert b.options.extra_bufts is False
    assert any("use_extra_bufts=False" in n for n in notices)
    saved = json.loads((tmp_path / "configs.json").read_text())
    (entry,) = saved.values()
    assert entry["extra_bufts"] is False and "use_extra_bufts=False" in entry["why"]
    b.close()

    again = _backend(tmp_path, name=EXTRA_BUFTS, memory=memory)  # the next start does not crash first
    assert again.options.extra_bufts is None and again.config.options.extra_bufts is False
    again.load()
    assert again.generate(Request(prompt="hello")).finish_reason is FinishReason.STOP
    assert again.notices and "remembered" in again.notices[0]
    again.close()


def test_gives_up_when_no_safer_configuration_is_left(tmp_path):
    b = _backend(tmp_path, name="tests.runner_fakes:CrashOnLoadFake")
    with pytest.raises(RunnerCrashedError, match="while loading the model.*no safer configuration"):
        b.load()
    b.close()


def test_a_runner_exits_when_hearth_dies(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, time; sys.path[:0] = %r\n"
        "from backends.runner.client import RunnerBackend\nfrom backends.api import LoadOptions\n"
        "from tests.fakes import fake_spec\n"
        "b = RunnerBackend(fake_spec(), LoadOptions(n_ctx=2048), backend=%r, log_dir=%r)\n"
        "b.load(); print(b.pid, flush=True); time.sleep(60)\n"
    ) % (sys.path, CRASHING, str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    runner_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(runner_pid) and psutil.Process(runner_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the runner outlived hearth"
        time.sleep(0.05)


def test_a_call_the_runner_died_under_runs_again_on_the_new_runner(tmp_path, monkeypatch):
    """tokenize and embed are pure reads: a call in flight when its runner is killed is sent once more to the
    runner that replaces it (its caller sees only time); a call that kills the runner every time raises after
    the second death, and the runner after it still serves."""
    monkeypatch.setenv("HEARTH_FAKE_CALL_DELAY", "0.5")
    b = _backend(tmp_path, name="tests.runner_fakes:EmbeddingFake")
    b.load()
    first = b.pid
    got: list = []
    t = threading.Thread(target=lambda: got.append(b.tokenize("abc")))
    t.start()
    deadline = time.monotonic() + 5
    while not b._runner.calls and time.monotonic() < deadline:  # the call is in the runner now
        time.sleep(0.01)
    assert b._runner.calls
    os.kill(first, 9)
    t.join(30)
    assert got == [[97, 98, 99]] and b.pid not in (None, first)
    monkeypatch.setenv("HEARTH_FAKE_CALL_DELAY", "0")
    with pytest.raises(RunnerCrashedError, match="SIGSEGV.*tokenize"):
        b.tokenize("CRASH-CALL")
    assert b.tokenize("ok") == [111, 107]
    b.close()


def test_embeddings_prove_a_runner_as_replies_do(tmp_path, monkeypatch):
    """An embeddings-only server's runner killed again and again, with embeddings computed in between, keeps being
    restarted: a finished embedding resets the crashes in a row as a finished reply does (the soak found that it
    gave up after MAX_CRASHES_IN_A_ROW kills)."""
    from backends.runner.client import MAX_CRASHES_IN_A_ROW

    monkeypatch.setenv("HEARTH_FAKE_CALL_DELAY", "0")
    b = _backend(tmp_path, name="tests.runner_fakes:EmbeddingFake")
    b.load()
    try:
        for _ in range(MAX_CRASHES_IN_A_ROW + 2):
            assert b.embed([[1, 2, 3]]).shape[0] == 1
            pid = b.pid
            os.kill(pid, 9)
            deadline = time.monotonic() + 30
            while b.pid in (None, pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert b.embed([[4, 5]]).shape[0] == 1  # still restarted after every kill
    finally:
        b.close()


def test_outside_kills_restart_the_same_configuration_and_count_as_no_crash(tmp_path):
    """SIGKILL from outside (no OOM kill: the kernel's count did not move) and SIGTERM end a runner without a fault
    of its configuration: it restarts as it was, however many times in a row, never down the ladder and never
    given up on; its notices say so (the soak's chaos kills a pinned backend's runner this way)."""
    from backends.runner.client import MAX_CRASHES_IN_A_ROW
    from backends.runner.process import oom_kills

    if oom_kills() is None:
        pytest.skip("no /proc/vmstat oom_kill here: a SIGKILL counts as a crash")
    b = _backend(tmp_path, name=EXTRA_BUFTS)  # a crash would turn its extra bufts off: an outside kill must not
    b.load()
    notices: list[str] = []
    b.on_notice = notices.append
    try:
        for i in range(MAX_CRASHES_IN_A_ROW + 2):
            pid = b.pid
            os.kill(pid, 9 if i % 2 == 0 else 15)
            deadline = time.monotonic() + 30
            while b.pid in (None, pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert b.pid not in (None, pid), notices
        assert b.config.options.extra_bufts is None and b._crashes_in_row == 0
        assert sum("killed from outside, not a crash of its own" in n for n in notices) == MAX_CRASHES_IN_A_ROW + 2
        assert b.generate(Request(prompt="fine")).finish_reason is FinishReason.STOP
    finally:
        b.close()


def test_a_configuration_that_served_is_loaded_again_after_a_crash_while_restarting(tmp_path, monkeypatch):
    """With no rung left (a named backend has no other backend to fall to), a crash while a restart loads used to
    end the backend at once; a configuration that has finished replies is loaded again instead (its load is known
    good), and serves."""
    monkeypatch.setenv("HEARTH_FAKE_LOADS", str(tmp_path / "loads"))
    b = _backend(tmp_path, name="tests.runner_fakes:CrashOnSecondLoadFake")
    b.load()
    try:
        assert b.generate(Request(prompt="hello")).finish_reason is FinishReason.STOP  # it served
        last = _events(b, "CRASH mid-reply")[-1]  # SIGSEGV after 3 tokens; the restart's first load crashes too
        assert last.finish_reason is FinishReason.ERROR and "SIGSEGV" in last.error
        assert b.generate(Request(prompt="again")).finish_reason is FinishReason.STOP
        assert (tmp_path / "loads").read_text() == "3"
    finally:
        b.close()
