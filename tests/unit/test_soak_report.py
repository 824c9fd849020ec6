"""The soak's report (app/soak.py) from outcomes, without a server: TTFT quantiles by priority, calm TTFT, the
counts, what fails a soak, and the text."""

from __future__ import annotations

from app.soak import _quantile, format_soak, slowest_ttft, soak_failed, ttft_by_priority
from app.soak_traffic import Outcome


def _o(status: str = "answered", priority: int = 0, ttft: float | None = 0.1) -> Outcome:
    return Outcome("openai_chat_stream", status, priority, ttft, 0.5, "", 0.0)


def test_quantiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (_quantile(values, 0.5), _quantile(values, 0.95), _quantile(values, 0.99)) == (50.0, 95.0, 99.0)
    assert _quantile([], 0.5) == 0.0 and _quantile([7.0], 0.99) == 7.0


def test_ttft_by_priority_counts_only_streamed_answers() -> None:
    outcomes = [_o(priority=-10, ttft=t / 1000) for t in (100, 200, 300)] + [_o(ttft=1.0), _o(ttft=None)]
    got = ttft_by_priority(outcomes)
    assert got["-10"] == {"p50": 200.0, "p95": 300.0, "p99": 300.0, "n": 3}
    assert got["0"]["n"] == 1 and got["0"]["p50"] == 1000.0


def _report(**over) -> dict:  # type: ignore[no-untyped-def]
    result = {
        "backend": "torch",
        "requests": 3,
        "answered": 2,
        "disconnected": 1,
        "clear_errors": 1,
        "lost": 0,
        "hangs": 0,
        "runner_kills": 2,
        "runner_restarts": 2,
        "rss_slope_mib_per_min": 0.2,
        "runners_rss_slope_mib_per_min": 1.0,
        "fd_growth": 0,
        "ttft_ms": {"-10": {"p50": 100.0, "p95": 200.0, "p99": 300.0, "n": 3}},
        "ttft_ms_calm": {"-10": {"p50": 90.0, "p95": 150.0, "p99": 160.0, "n": 2}},
        "left_processes": [],
        "lost_details": [],
        "server_alive": True,
        "server_exit_code": 0,
        "store": {
            "turns": 9,
            "saved": 14,
            "refused_while_full": 2,
            "disk_fills": 1,
            "fill_skipped": None,
            "lost": 0,
            "error": None,
        },
    } | over
    keys = ("requests", "answered", "clear_errors", "lost", "hangs", "runner_kills", "runner_restarts", "fd_growth")
    totals = {k: result[k] for k in keys} | {"store_lost": result["store"]["lost"]}
    return {**totals, "left_processes": result["left_processes"], "results": [result]}


def _store(**over) -> dict:  # type: ignore[no-untyped-def]
    return _report()["results"][0]["store"] | over


def test_what_fails_a_soak() -> None:
    assert not soak_failed(_report())
    assert soak_failed(_report(lost=1)) and soak_failed(_report(hangs=1))
    assert soak_failed(_report(left_processes=["4121 python -m backends.runner.child"]))
    assert soak_failed(_report(server_alive=False))
    assert soak_failed(_report(store=_store(lost=1)))  # a saved chat message missing after the disk filled
    assert soak_failed(_report(store=_store(error="OperationalError: disk I/O error")))  # not a StoreFullError


def test_the_text_report_says_what_happened() -> None:
    text = format_soak(_report(lost=1, lost_details=["canary: lost: canary text differs"]))
    assert "torch: 3 requests: 2 answered (1 disconnected on purpose), 1 clear errors, 1 lost, 0 hangs" in text
    assert "TTFT priority -10: p50 100 ms, p95 200 ms" in text and "away from kills p95 150 ms" in text
    assert "lost: canary: lost: canary text differs" in text
    assert "chat store: 9 turns, 14 messages saved, 2 saves refused while full (1 disk fills), 0 lost" in text
    skipped = format_soak(_report(store=_store(fill_skipped="/tmp is on tmpfs: its blocks are memory", disk_fills=0)))
    assert "(disk not filled: /tmp is on tmpfs: its blocks are memory)" in skipped


def test_the_slowest_first_tokens_say_how_long_after_a_kill_they_came() -> None:
    outcomes = [
        Outcome("openai_priority", "answered", -10, 3.8, 4.0, "", 100.0),
        Outcome("openai_chat_stream", "answered", 0, 0.2, 1.0, "", 10.0),
        Outcome("openai_chat", "answered", 0, None, 1.0, "", 20.0),
    ]
    got = slowest_ttft(outcomes, kills=[5.0, 90.0], n=2)
    assert got == [
        {"kind": "openai_priority", "priority": -10, "ttft_ms": 3800, "since_kill_s": 10.0},
        {"kind": "openai_chat_stream", "priority": 0, "ttft_ms": 200, "since_kill_s": 5.0},
    ]
    assert slowest_ttft(outcomes, kills=[])[0]["since_kill_s"] is None
