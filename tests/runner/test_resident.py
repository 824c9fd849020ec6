"""Resident runners (backends/runner/resident.py): a runner left loaded after its command ends serves the next
command that sends the very same load, exits when its time runs out, and is ended before anything else loads.
Real runner processes with the fake backends of tests/runner_fakes.py."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
import time

import psutil
import pytest

from backends.api import LoadOptions, Request, SamplingParams
from backends.runner import resident
from backends.runner.client import RunnerBackend
from tests.fakes import fake_spec

FAKE = "tests.runner_fakes:CrashingFake"

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="resident runners need SO_PEERCRED")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def folder():
    # short: a Unix socket's path has at most 108 bytes, and pytest's tmp_path can be longer than that
    d = resident.Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp")) / "f"  # mkdtemp: 0700, as resident_dir's root
    yield d
    for r in resident.residents(d):
        resident.evict(r)
    shutil.rmtree(d.parent, ignore_errors=True)


def _backend(folder, tmp_path, keep_alive_s=30.0, n_ctx=2048, backend=FAKE) -> RunnerBackend:
    return RunnerBackend(
        fake_spec(path=str(tmp_path / "fake.gguf")),
        LoadOptions(n_ctx=n_ctx),
        backend=backend,
        log_dir=tmp_path / "logs",
        resident_dir=folder,
        keep_alive_s=keep_alive_s,
        model_name="my-fake",
    )


def _left_loaded(folder, tmp_path) -> int:
    """A command that loaded the fake and ended: the pid of the runner it left loaded."""
    first = _backend(folder, tmp_path)
    first.load()
    pid = first.pid
    first.close()
    return pid


def test_a_runner_left_loaded_serves_the_next_backend_with_the_same_load(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    first = _backend(folder, tmp_path)
    first.load()
    pid = first.pid
    assert first.generate(Request(prompt="hi")).text
    first.close()

    (r,) = resident.residents(folder)
    assert r.pid == pid and r.model == "my-fake" and _alive(pid)
    assert r.until is not None and 20 < r.until - time.time() <= 30
    assert stat.S_IMODE(os.stat(r.path).st_mode) == 0o600

    second = _backend(folder, tmp_path)
    second.load()
    assert second.pid == pid  # no new process: the model was loaded already
    assert resident.residents(folder) == []  # taken: nobody else can connect to it now
    described = second.describe()
    assert described["runner_reused"] is True and described["runner_pid"] == pid
    assert second.generate(Request(prompt="again")).text == "one two three four five six seven eight"
    second.close()
    assert [x.pid for x in resident.residents(folder)] == [pid]  # and it lingers once more

    assert resident.evict_all(folder) == 1
    assert _wait_gone(pid) and resident.residents(folder) == []


def test_another_load_ends_the_resident_and_starts_its_own(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    old = _left_loaded(folder, tmp_path)
    assert _alive(old)

    other = _backend(folder, tmp_path, n_ctx=4096)  # another plan: another key
    other.load()
    new = other.pid
    assert new != old
    assert _wait_gone(old)  # its memory went back before the new runner loaded
    other.close()
    assert [r.pid for r in resident.residents(folder)] == [new]


def test_keep_alive_zero_never_lingers_and_ends_residents_it_meets(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    old = _left_loaded(folder, tmp_path)

    plain = _backend(folder, tmp_path, keep_alive_s=0)  # a server or a benchmark: never takes one over
    plain.load()
    assert plain.pid != old and _wait_gone(old)
    pid = plain.pid
    plain.close()
    assert _wait_gone(pid) and resident.residents(folder) == []


def test_a_resident_exits_when_nobody_comes_back(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    b = _backend(folder, tmp_path, keep_alive_s=0.5)
    b.load()
    pid = b.pid
    b.close()
    assert _wait_gone(pid)
    assert resident.residents(folder) == [] and not folder.exists()  # socket, description and folder removed


def test_a_runner_closed_mid_reply_does_not_linger(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0.05")
    b = _backend(folder, tmp_path)
    b.load()
    pid = b.pid
    stream = b.stream(Request(prompt="hello", sampling=SamplingParams(max_tokens=50)))
    next(stream)
    b.close()
    assert _wait_gone(pid) and resident.residents(folder) == []


def test_a_taken_over_runner_that_crashes_is_supervised_like_any(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    old = _left_loaded(folder, tmp_path)

    b = _backend(folder, tmp_path)
    b.load()
    assert b.pid == old
    result = b.generate(Request(prompt="CRASH please"))
    assert result.finish_reason.value == "error" and "resident runner" in (result.error or ""), (old, b.notices)
    assert _wait_gone(old)
    assert b.generate(Request(prompt="fine")).text  # a new runner of its own started
    assert b.pid != old
    b.close()


def test_only_one_of_two_commands_takes_a_resident(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    pid = _left_loaded(folder, tmp_path)
    (r,) = resident.residents(folder)

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(resident.attach(r.path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    taken = [a for a in got if a is not None]
    assert len(taken) == 1 and taken[0].pid == pid
    taken[0].sock.close()  # the owner left without Linger: the runner exits, as a runner always did
    assert _wait_gone(pid)


def test_a_stale_socket_is_removed(folder):
    assert resident.make_private(folder)
    path = folder / "fake-00000000-0000000000000000-1.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # bound, never listening: as a runner killed by SIGKILL leaves it
    assert resident.attach(path) is None and not path.exists()


def test_the_folder_must_be_the_users_own(monkeypatch):
    runtime = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
        folder = resident.resident_dir(resident.Path("/home/someone/.local/share/hearth"))
        assert folder is not None and folder.parent == resident.Path(runtime) / "hearth"
        assert not folder.exists()  # made when a runner first lingers, not by every command that looks
        assert resident.make_private(folder)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
        # another home gets another folder: tests and portable installs never meet each other's runners
        assert resident.resident_dir(resident.Path("/elsewhere")) != folder
        os.chmod(folder.parent, 0o755)  # readable by others: never used
        assert resident.resident_dir(resident.Path("/home/someone/.local/share/hearth")) is None
        assert not resident.make_private(folder)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_one_runner_lingers_per_load(folder, tmp_path, monkeypatch):
    """Two commands with the same load ran at once (two runners): when both end, one stays and the other exits;
    neither hides the other's socket (a runner nobody could reach would hold its memory for its whole time)."""
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0")
    a, b = _backend(folder, tmp_path), _backend(folder, tmp_path)
    a.load()
    b.load()
    pids = (a.pid, b.pid)
    assert pids[0] != pids[1]
    a.close()
    b.close()
    assert [r.pid for r in resident.residents(folder)] == [pids[0]]
    assert _wait_gone(pids[1])
    c = _backend(folder, tmp_path)
    c.load()
    assert c.pid == pids[0]
    c.close()
