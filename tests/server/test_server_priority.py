"""The API's `priority` (vLLM's: an integer, lower runs first, default 0): validated, carried to the backend,
honoured by the server's own admission, and reported per priority in /metrics."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from app.server.admission import Admission
from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def body(**kw) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize("bad", ["high", 1.5, True, 101, -101, 2**63])
def test_a_bad_priority_is_a_400_naming_it(live, bad) -> None:
    s = live(fake())
    with httpx.Client(base_url=s.url) as c:
        r = c.post(CHAT, json=body(priority=bad))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "priority"
        r = c.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "priority": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"


def test_priority_reaches_the_backend_and_the_metrics(live) -> None:
    backend = fake()
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        assert c.post(CHAT, json=body(priority=-3)).status_code == 200
        assert c.post(CHAT, json=body()).status_code == 200
        assert c.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "priority": 7}).status_code == 200
        assert c.post(CHAT, json=body(priority=-3, n=2)).status_code == 200
        metrics = c.get("/metrics").text
    assert [r.priority for r in backend.requests] == [-3, 0, 7, -3, -3]  # n choices keep the priority
    assert 'hearth_ttft_by_priority_seconds_count{priority="-3"} 3.0' in metrics
    assert 'hearth_ttft_by_priority_seconds_count{priority="0"} 1.0' in metrics
    assert 'hearth_ttft_recent_seconds{priority="7",quantile="0.95"}' in metrics
    assert 'hearth_ttft_target_met_ratio{priority="-3"} 1.0' in metrics  # the fake answers at once
    assert "hearth_ttft_target_seconds 0.5" in metrics


def test_a_serialising_backend_takes_queued_requests_by_priority(live) -> None:
    backend = fake()
    backend.hold = threading.Event()
    s = live(backend)
    order: list[int] = []

    def send(priority: int) -> None:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            assert c.post(CHAT, json=body(priority=priority)).status_code == 200

    first = threading.Thread(target=send, args=(0,))
    first.start()
    while not backend.requests:
        threading.Event().wait(0.01)
    threads = []
    for p in (5, 1, -2, 1):
        t = threading.Thread(target=send, args=(p,))
        t.start()
        threads.append(t)
        while s.app.state.runner.waiting < len(threads):
            threading.Event().wait(0.01)
    backend.hold.set()
    for t in [first, *threads]:
        t.join(30)
    order = [r.priority for r in backend.requests]
    assert order == [0, -2, 1, 1, 5]


def _run(coro):
    return asyncio.run(coro)


def test_admission_ranks_waiters_and_lets_a_better_priority_past_the_limit_of_a_preempting_backend() -> None:
    async def scenario(preempts: bool) -> list[str]:
        a = Admission(slots=2, preempts=preempts)
        got: list[str] = []

        async def enter(name: str, priority: int) -> None:
            await a.acquire(priority)
            got.append(name)

        await a.acquire(0)
        await a.acquire(0)  # both slots busy with priority 0
        tasks = [asyncio.create_task(enter(n, p)) for n, p in (("bg", 0), ("low", 3), ("chat", -1))]
        await asyncio.sleep(0.01)
        entered_at_once = list(got)
        a.release(0)
        a.release(0)
        await asyncio.sleep(0.01)
        for t in tasks:
            t.cancel()
        return entered_at_once + ["|"] + got[len(entered_at_once) :]

    # the torch engine preempts: chat (-1 beats the running 0s) is let in at once (3 running); the two freed
    # slots bring the count back to 2 with bg, the better of the waiters; low still waits
    assert _run(scenario(True)) == ["chat", "|", "bg"]
    # one at a time (no preemption): nobody passes the limit; the freed slots go to chat, then bg
    assert _run(scenario(False)) == ["|", "chat", "bg"]


def test_admission_ages_a_waiter_past_better_priorities() -> None:
    async def scenario() -> list[str]:
        a = Admission(slots=1, preempts=False, aging_s=0.05)
        got: list[str] = []

        async def enter(name: str, priority: int) -> None:
            await a.acquire(priority)
            got.append(name)
            a.release(priority)

        await a.acquire(0)
        low = asyncio.create_task(enter("low", 2))
        await asyncio.sleep(0.2)  # low waits 4 x aging_s: aged to -2
        hi = asyncio.create_task(enter("hi", -1))
        await asyncio.sleep(0.01)
        a.release(0)
        await asyncio.gather(low, hi)
        return got

    assert _run(scenario()) == ["low", "hi"]


def test_a_cancelled_waiter_gives_its_place_back() -> None:
    async def scenario() -> int:
        a = Admission(slots=1, preempts=False)
        await a.acquire(0)
        waiter = asyncio.create_task(a.acquire(0))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.sleep(0.01)
        a.release(0)
        await a.acquire(0)  # the slot is free: the cancelled waiter did not take it
        return a.num_running + a.num_waiting

    assert _run(scenario()) == 1
