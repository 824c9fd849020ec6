"""`hearth bench --soak DURATION [--chaos]`: a long run of mixed traffic against a real `hearth serve`, with every
request accounted for (issue 43).

For each engine in turn (both unless --backend names one) it starts `hearth serve` on a free port, drives
app/soak_traffic.py's mixed requests from several clients for DURATION, and with --chaos kills, crashes and freezes
the engine's runner processes at random (app/soak_watch.py's Chaos) while sampling the server's and the runners' RSS
and open descriptors (Sampler).  Then it stops the server (SIGTERM, as a user's Ctrl+C) and looks for anything left.

The server runs with HEARTH_RUNNER_TIMEOUT=SOAK_RUNNER_TIMEOUT_S so that a frozen runner is declared dead within
seconds (the default 30 s suits a desktop, where a long stall is more likely a swapping machine than a hang); the
soak tests what happens then, not how long the watchdog waits.

Report keys (--json, per engine under "results", and summed over engines at the top): requests, answered (planned
disconnects included, also counted under `disconnected`), clear_errors, lost, hangs, runner_kills,
runner_restarts, rss_slope_mib_per_min (the server's, after the warm-up; the runners' under
runners_rss_slope_mib_per_min), fd_growth, ttft_ms (p50/p95/p99 by priority; `ttft_ms_calm` leaves out requests
sent within KILL_SHADOW_S after a kill; `slowest_ttft` the slowest first tokens and how long after a kill they
came), left_processes, and `lost_details` (the first few lost or hung requests).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from app.server.background import free_port
from app.soak_chat import ChatStandIn
from app.soak_traffic import Outcome, Traffic, drive
from app.soak_watch import (
    Chaos,
    Sampler,
    fd_growth,
    left_processes,
    rss_slope_mib_per_min,
    runner_restarts,
)

SOAK_RUNNER_TIMEOUT_S = 5.0  # the server's heartbeat timeout during a soak (module docstring)
KILL_SHADOW_S = 10.0  # requests sent this soon after a kill are left out of ttft_ms_calm
START_TIMEOUT_S = 300.0
SUMMED = ("requests", "answered", "disconnected", "clear_errors", "lost", "hangs", "runner_kills", "runner_restarts")


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float
    chaos: bool
    backends: tuple[str, ...]
    model: str | None = None  # registered name or path; None = the settings' model (the starter)
    clients: int = 4
    ctx: int = 2048
    seed: int = 0
    warmup_s: float | None = None  # None: a fifth of the duration, at least 10 s


def run_soak(config: SoakConfig, err: TextIO) -> dict[str, Any]:
    """Soak each engine in turn; the report (the module docstring's keys)."""
    runs = [soak_engine(config, backend, err) for backend in config.backends]
    results = [report for report, _ in runs]
    total: dict[str, Any] = {key: sum(r[key] for r in results) for key in SUMMED}
    total["ttft_ms"] = ttft_by_priority([o for _, outcomes in runs for o in outcomes])
    total["rss_slope_mib_per_min"] = max(r["rss_slope_mib_per_min"] for r in results)
    total["fd_growth"] = max(r["fd_growth"] for r in results)
    total["left_processes"] = [p for r in results for p in r["left_processes"]]
    total["store_lost"] = sum(r["store"]["lost"] for r in results)
    return {"duration_s": config.duration_s, "chaos": config.chaos, **total, "results": results}


def soak_engine(config: SoakConfig, backend: str, err: TextIO) -> tuple[dict[str, Any], list[Outcome]]:
    """One engine's soak: start the server, drive and disturb it, stop it, account for everything.  Its report and
    every request's outcome."""
    port = free_port()
    proc, log = _start_server(config, backend, port)
    url = f"http://127.0.0.1:{port}"
    try:
        model = _wait_healthy(proc, url, log)
        print(f"soak: {backend} serving {model} on {url} for {config.duration_s:g} s", file=err, flush=True)
        sampler = Sampler(proc.pid)
        chaos = Chaos(proc.pid, random.Random(config.seed), stop_s=SOAK_RUNNER_TIMEOUT_S + 3) if config.chaos else None
        chat = ChatStandIn(url, model, random.Random(config.seed + 1), config.duration_s, fill=config.chaos)
        sampler.start()
        chat.start()
        if chaos is not None:
            chaos.start()
        try:
            outcomes = drive(Traffic(url, model, config.ctx), config.clients, config.duration_s, config.seed)
        finally:
            if chaos is not None:
                chaos.stop()
            chat.stop()
            sampler.stop()
        server_alive = proc.poll() is None
    finally:
        code = _stop_server(proc)
    pids = {
        proc.pid,
        *(p for s in sampler.samples for p in s.runner_pids),
        *(k.pid for k in (chaos.kills if chaos else [])),
    }
    left = left_processes(pids, port)
    report = _report(backend, config, outcomes, sampler, chaos)
    report.update(server_alive=server_alive, server_exit_code=code, left_processes=left, log=str(log))
    report["store"] = chat.report()
    shutil.rmtree(chat.directory, ignore_errors=True)
    return report, outcomes


def _start_server(config: SoakConfig, backend: str, port: int) -> tuple[subprocess.Popen, Path]:
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs)

    log_dir = get_paths().log_dir / "soak"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"serve-{backend}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    args = [sys.executable, "-m", "app", "serve", "--port", str(port), "--backend", backend, "--ctx", str(config.ctx)]
    args += ["--max-concurrency", "4", "--queue-limit", "32"] + (["--model", config.model] if config.model else [])
    env = {**os.environ, "HEARTH_RUNNER_TIMEOUT": str(SOAK_RUNNER_TIMEOUT_S)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> str:
    """The served model's name once /health answers; RuntimeError with the log's tail if the server exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"hearth serve exited with {proc.returncode} before it served:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(url + "/health", timeout=2)
            if r.status_code == 200:
                return str(r.json()["model"])
        time.sleep(0.5)
    raise RuntimeError(f"hearth serve did not answer /health within {START_TIMEOUT_S:g} s (log: {log})")


def _stop_server(proc: subprocess.Popen) -> int | None:
    """SIGTERM, as Ctrl+C would; SIGKILL after 60 s.  The exit code (None when it had to be killed)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _report(
    backend: str, config: SoakConfig, outcomes: list[Outcome], sampler: Sampler, chaos: Chaos | None
) -> dict[str, Any]:
    counts = {status: sum(1 for o in outcomes if o.status == status) for status in _STATUSES}
    warmup = config.warmup_s if config.warmup_s is not None else max(10.0, config.duration_s / 5)
    kills = [k.at_s for k in chaos.kills] if chaos is not None else []
    calm = [o for o in outcomes if not any(0 <= o.started_s - k <= KILL_SHADOW_S for k in kills)]
    return {
        "backend": backend,
        "requests": len(outcomes),
        "answered": counts["answered"] + counts["disconnected"],
        "disconnected": counts["disconnected"],
        "clear_errors": counts["clear_error"],
        "lost": counts["lost"],
        "hangs": counts["hang"],
        "runner_kills": len(kills),
        "runner_restarts": runner_restarts(sampler.samples),
        "rss_slope_mib_per_min": round(rss_slope_mib_per_min(sampler.samples, warmup), 3),
        "runners_rss_slope_mib_per_min": round(rss_slope_mib_per_min(sampler.samples, warmup, runners=True), 3),
        "fd_growth": fd_growth(sampler.samples, warmup),
        "ttft_ms": ttft_by_priority(outcomes),
        "ttft_ms_calm": ttft_by_priority(calm),
        "by_kind": _by_kind(outcomes),
        "slowest_ttft": slowest_ttft(outcomes, kills),
        "lost_details": [f"{o.kind}: {o.status}: {o.detail}" for o in outcomes if o.status in ("lost", "hang")][:20],
    }


_STATUSES = ("answered", "disconnected", "clear_error", "lost", "hang")


def ttft_by_priority(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    """p50/p95/p99 of the streamed answers' time to first token, in ms, by the requests' priority."""
    out: dict[str, dict[str, float]] = {}
    for priority in sorted({o.priority for o in outcomes if o.ttft_s is not None}):
        values = sorted(o.ttft_s * 1000 for o in outcomes if o.priority == priority and o.ttft_s is not None)
        out[str(priority)] = {f"p{q}": round(_quantile(values, q / 100), 1) for q in (50, 95, 99)} | {"n": len(values)}
    return out


def slowest_ttft(outcomes: list[Outcome], kills: list[float], n: int = 5) -> list[dict[str, Any]]:
    """The n slowest first tokens, with their kind, priority and the seconds since the last kill before them
    (None: none before), to tell a stream that waited out a kill from one that waited on other traffic."""
    streamed = sorted((o for o in outcomes if o.ttft_s is not None), key=lambda o: -(o.ttft_s or 0.0))[:n]
    out = []
    for o in streamed:
        before = [o.started_s - k for k in kills if k <= o.started_s]
        since = round(min(before), 1) if before else None
        out.append(
            {"kind": o.kind, "priority": o.priority, "ttft_ms": round((o.ttft_s or 0) * 1000), "since_kill_s": since}
        )
    return out


def _quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def _by_kind(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for o in outcomes:
        row = out.setdefault(o.kind, {})
        row[o.status] = row.get(o.status, 0) + 1
    return dict(sorted(out.items()))


def format_soak(report: dict[str, Any]) -> str:
    """The text report: one block per engine, then what failed."""
    lines = []
    for r in report["results"]:
        lines.append(
            f"{r['backend']}: {r['requests']} requests: {r['answered']} answered ({r['disconnected']} disconnected on "
            f"purpose), {r['clear_errors']} clear errors, {r['lost']} lost, {r['hangs']} hangs"
        )
        lines.append(
            f"  runner kills {r['runner_kills']}, restarts {r['runner_restarts']}; server RSS slope "
            f"{r['rss_slope_mib_per_min']:+.2f} MiB/min, runners {r['runners_rss_slope_mib_per_min']:+.2f} MiB/min, "
            f"descriptors {r['fd_growth']:+d}; server {'up throughout' if r['server_alive'] else 'DIED'}, "
            f"exit code {r['server_exit_code']}"
        )
        for priority, row in r["ttft_ms"].items():
            calm = r["ttft_ms_calm"].get(priority, {})
            lines.append(
                f"  TTFT priority {priority}: p50 {row['p50']:.0f} ms, p95 {row['p95']:.0f} ms, "
                f"p99 {row['p99']:.0f} ms (n {row['n']}; away from kills p95 {calm.get('p95', 0):.0f} ms)"
            )
        lines += [
            f"  slow first token: {t['kind']} (priority {t['priority']}) {t['ttft_ms']} ms, "
            + (f"{t['since_kill_s']:g} s after a kill" if t["since_kill_s"] is not None else "before any kill")
            for t in r.get("slowest_ttft", [])[:3]
        ]
        lines.append(_store_line(r["store"]))
        lines += [f"  left after stop: {p}" for p in r["left_processes"]]
        lines += [f"  lost: {d}" for d in r["lost_details"]]
    return "\n".join(lines)


def _store_line(st: dict[str, Any]) -> str:
    skipped = st["fill_skipped"]
    fills = f"{st['disk_fills']} disk fills" if skipped is None else f"disk not filled: {skipped}"
    line = (
        f"  chat store: {st['turns']} turns, {st['saved']} messages saved, {st['refused_while_full']} saves "
        f"refused while full ({fills}), {st['lost']} lost"
    )
    return line + (f"; FAILED: {st['error']}" if st["error"] else "")


def soak_failed(report: dict[str, Any]) -> bool:
    """What makes `hearth bench --soak` exit 1: a lost or hung request, a lost or unreadable saved message,
    something left, the server dying."""
    return bool(
        report["lost"]
        or report["hangs"]
        or report["store_lost"]
        or any(r["store"]["error"] for r in report["results"])
        or report["left_processes"]
        or not all(r["server_alive"] for r in report["results"])
    )
