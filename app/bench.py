"""`hearth bench` workload: a fixed-seed synthetic prompt set run on one backend per fresh subprocess.

The parent (`run_bench`) starts `python -m app.bench WORKLOAD_JSON` once per backend, so load time is a cold
start and peak memory belongs to that backend alone (the peak is that of the runner that holds the model).
The worker prints one JSON object per line on stdout:
{"progress": done, "total": n} while it runs, then {"result": {...}} per concurrency, or {"error": "..."}.
The prompts it sends and the paths one request takes (in process, chat template, HTTP) are app/bench_requests.py.

`busy_cores` (hearth bench --busy-cores N): N other processes spin, one core each, for as long as every
backend's worker runs (its load included), the way a browser tab, a compiler or another model take cores on
a user's machine; the figures are then what a backend keeps of its speed on a busy CPU.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from app.bench_requests import (
    Sample,
    send_chat,
    send_in_process,
    send_over_http,
    send_over_http_chat,
    synthetic_prompts,
    synthetic_texts,
)
from app.bench_requests import read_sse as _read_sse  # noqa: F401 - scripts/sampling_bench.py reaches it here, as before
from app.loading import hardware_report, open_backend
from app.measurements import record_bench_decode
from app.server.background import BackgroundServer
from app.settings import Settings, load_settings

FIGURES = (
    "load_s",
    "ttft_ms_p50",
    "ttft_ms_p95",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "aggregate_tokens_per_s",
    "peak_rss_mib",
    "peak_gpu_mib",
)


@dataclass
class Workload:
    model: str | None  # registered name or path; None = the default model
    backend: str  # registry name
    concurrency: list[int]  # threads submitting requests at once, one measurement each
    prompt_tokens: int = 128  # exact prompt length in tokens
    gen_tokens: int = 128  # exact generated tokens per request (ignore_eos)
    requests: int = 16  # requests per concurrency level
    seed: int = 0  # prompt ids and sampling seed
    # 0 = greedy; > 0: every request samples at this temperature with its own seed (seed + request index), in
    # process with hearth's other defaults (top-k 40, top-p 0.95, min-p 0.05), over HTTP with OpenAI's (none)
    temperature: float = 0.0
    threads: int | None = None  # CPU threads for the backend
    busy_cores: int = 0  # competing processes spinning one core each during the runs (busy_processes)
    extra: dict[str, Any] = field(default_factory=dict)  # reserved for backend-specific settings


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def ttft_by_priority(ttft_ms: list[float], priorities: list[int], target_ms: float) -> dict[str, dict[str, float]]:
    """{priority: {requests, p50_ms, p95_ms, met_pct}} (priority as text: JSON keys), request i at priorities[i]."""
    out: dict[str, dict[str, float]] = {}
    for p in sorted(set(priorities)):
        values = [t for t, q in zip(ttft_ms, priorities) if q == p]
        out[str(p)] = {
            "requests": len(values),
            "p50_ms": percentile(values, 50),
            "p95_ms": percentile(values, 95),
            "met_pct": 100 * sum(t <= target_ms for t in values) / len(values),
        }
    return out


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


@dataclass
class _Run:
    """What every level of one worker run shares."""

    w: Workload
    backend: Any  # the loaded backend (in this process or its runner's client)
    load_s: float  # cold start: settings, resolve, plan and load
    target_ms: float  # the TTFT target and the bar for ttft_met_pct
    priorities: list[int]  # request i runs at priorities[i % len]
    remote: bool  # the model is on a server: text prompts, its memory is not ours to measure
    chat: bool  # text prompts as one user message, through the template
    vocab: int  # the model's vocabulary size (token-id prompts)
    specials: set[int]  # ids a token-id prompt never holds: EOS and BOS

    def priority(self, i: int) -> int:
        """The priority request `i` runs at."""
        return self.priorities[i % len(self.priorities)]


class _Progress:
    """Counts the finished requests of every path and level (from the pool's threads) and prints
    {"progress": done, "total": total} for each."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.done += 1
            _emit({"progress": self.done, "total": self.total})


def worker(w: Workload) -> None:
    """Run the workload in this process (a fresh one) and print JSON lines (see the module docstring).
    With extra["http"], every level runs again through hearth's server on 127.0.0.1 (rows "<backend>+http")."""
    t0 = time.perf_counter()
    target_ms = float(w.extra.get("ttft_target_ms", 500.0))
    priorities = list(w.extra.get("priorities") or [0])  # request i runs at priorities[i % len]
    try:
        loaded = open_backend(_worker_settings(w, target_ms), command="bench")
    except Exception as e:  # noqa: BLE001 - any load failure becomes one line in the table, not a dead run
        _emit({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return
    load_s = time.perf_counter() - t0
    specials = set(loaded.spec.eos_token_ids)
    if loaded.spec.bos_token_id is not None:
        specials.add(loaded.spec.bos_token_id)
    remote = w.backend == "remote"
    chat = bool(w.extra.get("chat")) and not remote
    run = _Run(w, loaded.backend, load_s, target_ms, priorities, remote, chat, loaded.spec.vocab_size, specials)
    modes, server = _modes(run)
    try:
        aggregates, one_stream = _run_modes(run, modes)
        if not remote and one_stream is not None:
            _record_decode(loaded, one_stream, aggregates.get(16))
    finally:
        if server is not None:
            server.stop()
        run.backend.close()


def _worker_settings(w: Workload, target_ms: float) -> Settings:
    """The worker's Settings: a context that holds one request, a KV pool for the highest concurrency."""
    return load_settings(
        model=w.model,
        backend=w.backend,
        threads=w.threads,
        ctx=max(512, w.prompt_tokens + w.gen_tokens + 16),
        max_concurrency=max(w.concurrency),
        url=w.extra.get("url"),
        remote_model=w.extra.get("remote_model"),
        # --tensor-parallel is the torch engine's; llama.cpp splits GPUs itself
        tensor_parallel=w.extra.get("tensor_parallel") if w.backend == "torch" else None,
        # --speculative is the torch engine's too: the llama.cpp rows of the same table run without it
        speculative=w.extra.get("speculative") if w.backend == "torch" else None,
        draft_model=w.extra.get("draft_model") if w.backend == "torch" else None,
        ttft_target_ms=target_ms,
    )


def _modes(run: _Run) -> tuple[list[tuple[str, Any]], BackgroundServer | None]:
    """The (row name, send one request) paths to measure: in process, then with extra["http"] through hearth's
    server (started here; the caller stops it)."""
    w = run.w
    local = send_chat(run.backend, w, remote=run.remote) if run.remote or run.chat else send_in_process(run.backend, w)
    modes: list[tuple[str, Any]] = [(w.backend, local)]
    server = None
    if w.extra.get("http") and not run.remote:
        server = BackgroundServer(
            run.backend, "bench", limits={"max_concurrency": max(w.concurrency), "queue_limit": max(64, w.requests)}
        )
        modes.append(
            (f"{w.backend}+http", send_over_http_chat(server.url, w) if run.chat else send_over_http(server.url, w))
        )
    return modes, server


def _run_modes(run: _Run, modes: list[tuple[str, Any]]) -> tuple[dict[int, float], float | None]:
    """Every level of every path, one result line each; returns the in-process aggregate tokens/s by concurrency
    and the decode tokens/s of one stream (for this GPU's records: _record_decode)."""
    w = run.w
    progress = _Progress(len(modes) * len(w.concurrency) * w.requests)
    aggregates: dict[int, float] = {}  # aggregate tokens/s by concurrency, in this process
    one_stream: float | None = None
    for mode, (name, run_one) in enumerate(modes):
        for level, conc in enumerate(w.concurrency):
            # Fresh prompts per level and path: a backend with a prefix cache must not get earlier
            # prompts for free (the same seed gives the same prompts on every backend).
            prompts = _prompts(run, w.seed + 7919 * level + 104729 * mode)
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=conc) as pool:
                samples = list(pool.map(partial(_one_request, run, run_one, prompts, progress), range(w.requests)))
            wall = time.perf_counter() - start
            error = _level_error(samples, w.gen_tokens)
            if error is not None:
                _emit({"result": {"backend": name, "concurrency": conc, "error": error}})
                continue
            result = _level_result(run, name, conc, samples, wall)
            if mode == 0:
                aggregates[conc] = result["aggregate_tokens_per_s"]
                if conc == 1:
                    one_stream = result["decode_tokens_per_s"]
            elif conc in aggregates:
                result["http_vs_in_process"] = result["aggregate_tokens_per_s"] / aggregates[conc]
            _emit({"result": result})
    return aggregates, one_stream


def _prompts(run: _Run, seed: int) -> list[Any]:
    """One level's prompts: text for a remote model or --chat, else token ids."""
    w = run.w
    if run.remote or run.chat:
        return synthetic_texts(w.requests, w.prompt_tokens, seed)
    return synthetic_prompts(run.vocab, run.specials, w.requests, w.prompt_tokens, seed)


def _one_request(run: _Run, run_one: Any, prompts: list[Any], progress: _Progress, i: int) -> Sample:
    sample = run_one(prompts[i], run.w.seed + i, run.priority(i))
    progress.tick()
    return sample


def _level_error(samples: list[Sample], gen_tokens: int) -> str | None:
    """Why a level has no figures: a request's error, else a reply of another length than --gen-tokens."""
    errors = [s.error for s in samples if s.error]
    short = [s.tokens for s in samples if s.tokens != gen_tokens]
    if errors:
        return errors[0]
    return f"generated {short[0]} tokens, not {gen_tokens}" if short else None


def _level_result(run: _Run, name: str, conc: int, samples: list[Sample], wall: float) -> dict[str, Any]:
    """One level's row of figures (FIGURES and the rest of the JSON record)."""
    w, backend, target_ms = run.w, run.backend, run.target_ms
    ttft = [s.ttft_s * 1000 for s in samples]
    return {
        "backend": name,
        "concurrency": conc,
        "load_s": run.load_s,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p95": percentile(ttft, 95),
        "ttft_target_ms": target_ms,
        "ttft_met_pct": 100 * sum(t <= target_ms for t in ttft) / len(ttft),
        "ttft_by_priority": ttft_by_priority(ttft, [run.priority(i) for i in range(w.requests)], target_ms),
        "prefill_tokens_per_s": statistics.mean(s.prefill_tokens_per_s for s in samples),
        "decode_tokens_per_s": statistics.mean(s.decode_tokens_per_s for s in samples),
        "aggregate_tokens_per_s": sum(s.tokens for s in samples) / wall,
        # the process that holds the model (the runner): its own VmHWM, loading's peak included
        "peak_rss_mib": None if run.remote else backend.stats().peak_rss_bytes / 2**20,
        "peak_gpu_mib": None if run.remote else (backend.stats().gpu_bytes / 2**20) or None,
        "wall_s": wall,
        # the torch engine's CPU threads at the end of the level (it adapts them: threads.py)
        "cpu_threads": _cpu_threads(backend),
        "requests": w.requests,
        "prompt_tokens": w.prompt_tokens,
        "gen_tokens": w.gen_tokens,
    }


def _record_decode(loaded: Any, tokens_per_s: float, tokens_per_s_16: float | None) -> None:
    """Keep what this run measured on a GPU for the plans after it (app/measurements.py: the planner prefers a
    card's own decode records to its table); nothing on a CPU.  A failure to record never fails the bench."""
    plan = loaded.decision.plan
    if plan is None or not plan.device.startswith("cuda"):
        return
    try:
        record_bench_decode(hardware_report(), loaded.spec, plan, tokens_per_s, tokens_per_s_16)
    except Exception as exc:  # noqa: BLE001 - a record is a bonus: say why it was skipped
        print(f"hearth bench: decode speed not recorded: {type(exc).__name__}: {exc}", file=sys.stderr)


def _cpu_threads(backend: Any) -> int | None:
    try:
        value = backend.describe().get("cpu_threads")
    except Exception:  # noqa: BLE001 - a figure for the report, never a failed run
        return None
    return value if isinstance(value, int) else None


BUSY_LOOP = "while True:\n    pass"


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen]]:
    """`n` processes that each keep one core busy (a Python `while True: pass`, not pinned to a core: the
    scheduler moves it as it moves any program) for the duration of the block; killed when it ends."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-S", "-c", BUSY_LOOP],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_bench(
    workload: Workload, backends: list[str], progress: Callable[[str, int, int], None] | None = None
) -> list[dict[str, Any]]:
    """Run `workload` on each backend in its own fresh subprocess; results in backend, concurrency order,
    each with ratios to the first backend's figures at the same concurrency (`ratio_<figure>`).  With
    workload.busy_cores, that many busy processes run beside every backend (busy_processes)."""
    with busy_processes(workload.busy_cores):
        results = _run_backends(workload, backends, progress)
    add_ratios(results)
    return results


def _run_backends(
    workload: Workload, backends: list[str], progress: Callable[[str, int, int], None] | None
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for name in backends:
        w = Workload(**{**asdict(workload), "backend": name})
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.bench", json.dumps(asdict(w))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        got: list[dict[str, Any]] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a library printed to stdout
            if "progress" in msg and progress:
                progress(name, msg["progress"], msg["total"])
            elif "result" in msg:
                got.append(msg["result"])
            elif "error" in msg:
                got = [{"backend": name, "concurrency": c, "error": msg["error"]} for c in w.concurrency]
        stderr = proc.stderr.read() if proc.stderr else ""
        if proc.wait() != 0 and not got:
            last = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            got = [{"backend": name, "concurrency": c, "error": last} for c in w.concurrency]
        results.extend(got)
    return results


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Set `ratio_<figure>` = figure / the first backend's figure at the same concurrency (None when either
    is missing or zero)."""
    first: dict[int, dict[str, Any]] = {}
    for r in results:
        first.setdefault(r["concurrency"], r)
    for r in results:
        base = first[r["concurrency"]]
        for f in FIGURES:
            a, b = r.get(f), base.get(f)
            r[f"ratio_{f}"] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


if __name__ == "__main__":
    worker(Workload(**json.loads(sys.argv[1])))
