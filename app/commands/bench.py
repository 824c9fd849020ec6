"""`hearth bench`: the same fixed-seed workload on each backend, side by side (speed, latency, memory)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import TYPE_CHECKING

from app.commands.common import DRAFT_MODEL, MODEL, SPECULATIVE, TENSOR_PARALLEL, THREADS
from backends.api import PRIORITY_MAX, PRIORITY_MIN
from backends.errors import InvalidRequestError

if TYPE_CHECKING:
    from app.bench import Workload

NAME = "bench"
HELP = "benchmark backends side by side: load time, TTFT, prefill/decode tok/s, memory"
ORDER = 60
DESCRIPTION = """Run the same fixed-seed synthetic workload on each backend, each in a fresh process.

  hearth bench                                           starter model, llama.cpp and torch, concurrency 1,4,16
  hearth bench --backends llama.cpp --concurrency 1,16 --gen-tokens 128 --requests 16 --json
  hearth bench --concurrency 1,16 --busy-cores 1         the same with one core kept busy by another process

Every request has exactly --prompt-tokens prompt tokens and generates exactly --gen-tokens tokens.
A backend that cannot batch serves concurrent requests one after another (the honest baseline).

Peak RSS is the worker process's own (VmHWM).  The runtime baseline, printed on its own line (JSON:
runtime_baseline_mib), is the peak RSS of a fresh `python -c "import torch, app.cli"`: memory no plan counts
because no model causes it; a backend's peak should stay within its plan's total plus this baseline."""


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _priority_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or not all(PRIORITY_MIN <= v <= PRIORITY_MAX for v in values):
        raise argparse.ArgumentTypeError(f"expected priorities from {PRIORITY_MIN} to {PRIORITY_MAX}, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags by topic, in the order --help lists them."""
    _add_workload_arguments(p)
    _add_engine_arguments(p)
    _add_path_and_latency_arguments(p)
    _add_output_and_remote_arguments(p)
    _add_soak_arguments(p)


def _add_soak_arguments(p: argparse.ArgumentParser) -> None:
    """The soak: a long run of mixed traffic against `hearth serve`, every request accounted for (app/soak.py)."""
    g = p.add_argument_group(
        "soak",
        "hearth bench --soak DURATION [--chaos] [--backend B] [--json]: start `hearth serve` (each engine in turn) and "
        "drive mixed traffic for DURATION from several clients (both APIs, streams, schemas, tools, embeddings, "
        "priorities, n > 1, logprobs, clients that leave, prompts at the context's edge, hostile bodies); exit 1 "
        "when a request is lost or hangs, the server dies or a process is left after it stops",
    )
    g.add_argument("--soak", metavar="DURATION", help="run the soak for this long (30m, 60s, 1h30m)")
    g.add_argument(
        "--chaos",
        action="store_true",
        help="also SIGKILL, SIGSEGV and SIGSTOP the engine runners at random intervals",
    )
    g.add_argument("--backend", metavar="B", help="soak this engine only (default: llama.cpp, then torch)")
    g.add_argument("--clients", type=int, default=4, metavar="N", help="concurrent soak clients (default 4)")


def _add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """What to run: the model, the backends in order, the concurrency levels and the requests of each."""
    MODEL.add(p)
    p.add_argument(
        "--backends",
        default="llama.cpp,torch",
        metavar="B1,B2",
        help="backends in order; ratios are to the first (default llama.cpp,torch)",
    )
    p.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 4, 16],
        metavar="1,4,16",
        help="requests in flight at once (default 1,4,16)",
    )
    p.add_argument("--prompt-tokens", dest="prompt_tokens", type=int, default=128, metavar="N")
    p.add_argument("--gen-tokens", dest="gen_tokens", type=int, default=128, metavar="N")
    p.add_argument("--requests", type=int, default=16, metavar="N", help="requests per concurrency level")
    p.add_argument("--seed", type=int, default=0, metavar="S")


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """How each backend runs: sampling, CPU threads (and a busy CPU), GPUs, speculative decoding."""
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 = greedy (default); T > 0: every request samples at T with its own seed (--seed + its index): "
        "in process with hearth's defaults (top-k 40, top-p 0.95, min-p 0.05), with --http as OpenAI clients "
        "send it (no truncation)",
    )
    THREADS.add(p)
    p.add_argument(
        "--busy-cores",
        dest="busy_cores",
        type=int,
        default=0,
        metavar="N",
        help="run N competing processes that each keep one core busy during every backend's runs (load "
        "included), as other programs do on a user's machine; said under the table and in --json "
        "(workload.busy_cores) (default 0)",
    )
    TENSOR_PARALLEL.add(
        p,
        help="the torch engine's rows run in N tensor-parallel ranks (one per GPU; default: the plan "
        "decides); llama.cpp's rows keep its own split",
    )
    SPECULATIVE.add(p)
    DRAFT_MODEL.add(p)


def _add_path_and_latency_arguments(p: argparse.ArgumentParser) -> None:
    """How requests reach the engine (in process, over HTTP, as chat) and the latency they are held to."""
    p.add_argument(
        "--http",
        action="store_true",
        help="also run every level through hearth's OpenAI server on 127.0.0.1 (streaming "
        "/v1/completions); rows '<backend>+http', and in --json 'http_vs_in_process'",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="chat prompts: one user message of --prompt-tokens common words through the model's chat "
        "template (in process: the one request builder; with --http: streaming "
        "/v1/chat/completions), as chat clients send them",
    )
    p.add_argument(
        "--ttft-target-ms",
        dest="ttft_target_ms",
        type=float,
        default=500.0,
        metavar="MS",
        help="the torch engine's TTFT target, and the bar for the 'TTFT ok' column: the share of requests whose "
        "first token came within it (default 500)",
    )
    p.add_argument(
        "--priorities",
        type=_priority_list,
        default=[0],
        metavar="0,-1",
        help="request i runs at priority P[i %% len(P)] (lower runs first); TTFT percentiles and the share "
        "within the target are then reported per priority (default 0, the API's)",
    )


def _add_output_and_remote_arguments(p: argparse.ArgumentParser) -> None:
    """The JSON output, and the server a remote backend's rows run on."""
    p.add_argument("--json", action="store_true", help='print {"results": [...]} instead of a table')
    p.add_argument(
        "--url",
        metavar="URL",
        help="with --backends remote: the OpenAI-compatible server's base URL "
        "(prompts are then text of --prompt-tokens common words; --http does not apply)",
    )
    p.add_argument(
        "--remote-model",
        dest="remote_model",
        metavar="NAME",
        help="with --backends remote: the model to ask for (default: the first at /v1/models)",
    )


def format_table(results: list[dict]) -> str:
    cols = [
        ("backend", "backend", "{}"),
        ("conc", "concurrency", "{}"),
        ("load s", "load_s", "{:.2f}"),
        ("TTFT p50 ms", "ttft_ms_p50", "{:.1f}"),
        ("TTFT p95 ms", "ttft_ms_p95", "{:.1f}"),
        ("TTFT ok %", "ttft_met_pct", "{:.0f}"),
        ("prefill tok/s", "prefill_tokens_per_s", "{:.0f}"),
        ("decode tok/s", "decode_tokens_per_s", "{:.1f}"),
        ("aggr tok/s", "aggregate_tokens_per_s", "{:.1f}"),
        ("RSS MiB", "peak_rss_mib", "{:.0f}"),
        ("GPU MiB", "peak_gpu_mib", "{:.0f}"),
    ]
    rows = [[h for h, _, _ in cols]]
    for r in results:
        if r.get("error"):
            rows.append([r["backend"], str(r["concurrency"]), f"error: {r['error']}"])
            continue
        row = []
        for _, key, fmt in cols:
            v = r.get(key)
            cell = "-" if v is None else fmt.format(v)
            ratio = r.get(f"ratio_{key}")
            if (
                ratio is not None
                and key not in ("backend", "concurrency")
                and r is not results[0]
                and abs(ratio - 1) > 1e-9
            ):
                cell += f" ({ratio:.2f}x)"
            row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows if len(row) == len(cols) and i < len(row)) for i in range(len(cols))]
    lines = []
    for row in rows:
        if len(row) != len(cols):
            lines.append("  ".join([row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2]]))
        else:
            lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+asyncio, atexit, base64, 46 hearth modules)
    from app.bench import run_bench

    if args.soak is not None:
        return _run_soak(args)
    _check_arguments(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "remote" in backends:  # a wrong key or an unreachable URL: one line and exit 2, before any table
        _check_remote(args)
    workload = _workload(args, backends[0])
    tty = sys.stderr.isatty()
    if tty:
        sys.stderr.write("  loading ...\r")
    results = run_bench(workload, backends, partial(_progress, tty))
    baseline = runtime_baseline_mib()
    if args.json:
        print(json.dumps(_json_record(workload, baseline, results), indent=2))
    else:
        _print_report(workload, baseline, results)
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    """The workload's numbers, checked before any backend loads (InvalidRequestError: one line, exit 2)."""
    if min(args.prompt_tokens, args.gen_tokens, args.requests) < 1:
        raise InvalidRequestError(
            "--prompt-tokens, --gen-tokens and --requests must be at least 1",
            "e.g. --prompt-tokens 128 --gen-tokens 128 --requests 16",
        )
    cores = os.cpu_count() or 1
    if not 0 <= args.busy_cores <= cores:
        raise InvalidRequestError(
            f"--busy-cores {args.busy_cores}: this machine has {cores} logical cores",
            f"use 0 to {cores} (1 is one core taken by another program)",
        )
    if not args.temperature >= 0:  # NaN too
        raise InvalidRequestError(f"--temperature must be >= 0, got {args.temperature}", "0 = greedy, e.g. 0.8")


def _check_remote(args: argparse.Namespace) -> None:
    """Open the remote server once (and close it): a wrong key or an unreachable URL fails here."""
    # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 13 hearth modules)
    from app.remote import open_remote
    from app.settings import load_settings  # lazy: keeps `hearth --help` light (+platformdirs, 2 hearth modules)

    open_remote(load_settings(backend="remote", url=args.url, remote_model=args.remote_model)).backend.close()


def _workload(args: argparse.Namespace, backend: str) -> Workload:
    """The flags as the Workload every backend's worker runs; `extra` holds only the flags given."""
    # lazy: keeps `hearth --help` light (+asyncio, atexit, base64, 46 hearth modules)
    from app.bench import Workload

    return Workload(
        model=args.model,
        backend=backend,
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        requests=args.requests,
        seed=args.seed,
        temperature=args.temperature,
        threads=args.threads,
        busy_cores=args.busy_cores,
        extra={
            k: v
            for k, v in (
                ("http", args.http or None),
                ("chat", args.chat or None),
                ("url", args.url),
                ("remote_model", args.remote_model),
                ("tensor_parallel", args.tensor_parallel),
                ("speculative", args.speculative),
                ("draft_model", args.draft_model),
                ("ttft_target_ms", args.ttft_target_ms),
                ("priorities", args.priorities if args.priorities != [0] else None),
            )
            if v is not None
        },
    )


def _progress(tty: bool, name: str, done: int, total: int) -> None:
    """A progress bar on a terminal's stderr (nothing when stderr is not one)."""
    if not tty:
        return
    bar = "#" * (30 * done // total)
    sys.stderr.write(f"\r  {name:10s} [{bar:30s}] {done}/{total} requests")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _json_record(workload: Workload, baseline: float | None, results: list[dict]) -> dict:
    """The --json object: the workload, the runtime baseline and every row (scripts parse these keys)."""
    keys = ("model", "concurrency", "prompt_tokens", "gen_tokens", "requests", "seed", "busy_cores", "temperature")
    return {
        "workload": {k: getattr(workload, k) for k in keys},
        "runtime_baseline_mib": baseline,
        "results": results,
    }


def _print_report(workload: Workload, baseline: float | None, results: list[dict]) -> None:
    """The table, then the per-priority lines, the runtime baseline and the busy-CPU line under it."""
    print(format_table(results))
    by_priority = format_priorities(results)
    if by_priority:
        print(by_priority)
    print(format_baseline(baseline))
    if workload.busy_cores:
        print(format_busy(workload.busy_cores, results))


def format_priorities(results: list[dict]) -> str:
    """One line per (row, priority) when the requests ran at several priorities ('' otherwise)."""
    lines = []
    for r in results:
        groups = r.get("ttft_by_priority") or {}
        if len(groups) < 2:
            continue
        for p, g in groups.items():
            lines.append(
                f"  {r['backend']} x{r['concurrency']} priority {p}: {g['requests']} requests, TTFT p50 "
                f"{g['p50_ms']:.0f} ms, p95 {g['p95_ms']:.0f} ms, {g['met_pct']:.0f}% within "
                f"{r['ttft_target_ms']:g} ms"
            )
    return "\n".join(lines)


def runtime_baseline_mib() -> float | None:
    """Peak RSS of a fresh `python -c "import torch, app.cli"` in MiB (app.memory_check), None if it failed."""
    import subprocess  # lazy: keeps `hearth --help` light (+subprocess)

    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 27 hearth modules)
    from app.memory_check import MIB, runtime_baseline_bytes

    try:
        return round(runtime_baseline_bytes() / MIB, 1)
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None


def format_baseline(mib: float | None) -> str:
    figure = "unknown (the subprocess failed)" if mib is None else f"{mib:.0f} MiB"
    return (
        f'runtime baseline: {figure} peak RSS of `python -c "import torch, app.cli"` (inside every RSS '
        "figure above; no plan counts it)"
    )


def format_busy(n: int, results: list[dict]) -> str:
    """The line under the table that says the CPU was busy, with each backend's CPU threads at the end of its
    runs (both engines adapt them: backends/thread_tuner.py)."""
    by_backend: dict[str, set[int]] = {}
    for r in results:
        if r.get("cpu_threads"):
            by_backend.setdefault(r["backend"], set()).add(r["cpu_threads"])
    ran = ", ".join(f"{b} {'/'.join(map(str, sorted(t)))}" for b, t in by_backend.items())
    chosen = f"; CPU threads at the end of the runs: {ran}" if ran else ""
    return (
        f"busy CPU: {n} other process{'es' if n > 1 else ''} kept {'a core' if n == 1 else f'{n} cores'} busy "
        f"(a spinning loop each) during every run{chosen}"
    )


def _run_soak(args: argparse.Namespace) -> int:
    """`--soak`: app/soak.py's run; the report as text or JSON; 1 when anything was lost (soak_failed)."""
    from app.durations import duration_seconds  # lazy: keeps `hearth --help` light (+1 hearth module)
    from app.soak import SoakConfig, format_soak, run_soak, soak_failed  # lazy: heavy: httpx, psutil

    try:
        duration = duration_seconds(args.soak, "--soak")
    except ValueError as exc:
        raise InvalidRequestError(str(exc), "e.g. --soak 30m or --soak 60s") from None
    if duration is None or duration <= 0 or args.clients < 1:
        raise InvalidRequestError("--soak needs a positive duration and --clients at least 1", "e.g. --soak 30m")
    backends = (args.backend,) if args.backend else ("llama.cpp", "torch")
    config = SoakConfig(duration, args.chaos, backends, model=args.model, clients=args.clients, seed=args.seed)
    report = run_soak(config, sys.stderr)
    print(json.dumps(report, indent=2) if args.json else format_soak(report))
    return 1 if soak_failed(report) else 0
