"""`hearth bench` workload: a fixed-seed synthetic prompt set run on one backend per fresh subprocess.

The parent (`run_bench`) starts `python -m app.bench WORKLOAD_JSON` once per backend, so load time is a cold
start and peak memory belongs to that backend alone (the peak is that of the runner that holds the model).
The worker prints one JSON object per line on stdout:
{"progress": done, "total": n} while it runs, then {"result": {...}} per concurrency, or {"error": "..."}.

`busy_cores` (hearth bench --busy-cores N): N other processes spin, one core each, for as long as every
backend's worker runs (its load included), the way a browser tab, a compiler or another model take cores on
a user's machine; the figures are then what a backend keeps of its speed on a busy CPU.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from app.loading import hardware_report, open_backend
from app.measurements import record_bench_decode
from app.requests import chat_request
from app.server.background import BackgroundServer
from app.settings import load_settings
from backends.api import Request, SamplingParams

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


def synthetic_prompts(vocab: int, specials: set[int], n: int, length: int, seed: int) -> list[tuple[int, ...]]:
    """`n` deterministic prompts of exactly `length` ids, drawn from the vocabulary minus special tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < length:
            t = rng.randrange(vocab)
            if t not in specials:
                ids.append(t)
        out.append(tuple(ids))
    return out


_WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "it",
    "his",
    "her",
    "they",
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "number",
    "night",
    "point",
    "home",
)


def synthetic_texts(n: int, length: int, seed: int) -> list[str]:
    """`n` deterministic prompts of `length` common English words (about one token each): a remote model's
    tokenizer is the server's, so its prompts are text, not ids, and their token counts are about `length`."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(length)) for _ in range(n)]


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
class _Sample:
    """One request's figures, from either path."""

    tokens: int
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    error: str | None = None


def _in_process(backend: Any, w: Workload) -> Callable[[tuple[int, ...], int, int], _Sample]:
    def one(prompt: tuple[int, ...], seed: int, priority: int) -> _Sample:
        params = SamplingParams(temperature=w.temperature, max_tokens=w.gen_tokens, ignore_eos=True, seed=seed)
        c = backend.generate(Request(prompt_token_ids=prompt, sampling=params, priority=priority))
        return _Sample(
            len(c.token_ids), c.stats.ttft_s, c.stats.prefill_tokens_per_s, c.stats.decode_tokens_per_s, c.error
        )

    return one


def _chat(backend: Any, w: Workload, *, remote: bool) -> Callable[[str, int, int], _Sample]:
    """Each prompt is one user message through the one request builder (the model's chat template, as the
    server does for /v1/chat/completions): --chat on a local model, or a remote model (--backend remote), whose
    generated tokens are the server's count (its usage chunk, else the streamed deltas)."""

    def one(prompt: str, seed: int, priority: int) -> _Sample:
        params = SamplingParams(temperature=w.temperature, max_tokens=w.gen_tokens, ignore_eos=True, seed=seed)
        messages = [{"role": "user", "content": prompt}]
        c = backend.generate(chat_request(backend.spec, messages, params, priority=priority).request)
        return _Sample(
            c.stats.completion_tokens if remote else len(c.token_ids),
            c.stats.ttft_s,
            c.stats.prefill_tokens_per_s,
            c.stats.decode_tokens_per_s,
            c.error,
        )

    return one


def _over_http_chat(url: str, w: Workload) -> Callable[[str, int, int], _Sample]:
    """--chat over HTTP: a streaming POST /v1/chat/completions with one user message (what chat clients send)."""
    import httpx  # lazy: heavy: httpx

    local = threading.local()

    def one(prompt: str, seed: int, priority: int) -> _Sample:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, timeout=600)
        body = {
            "model": "bench",
            "priority": priority,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": w.gen_tokens,
            "temperature": w.temperature,
            "seed": seed,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        return _read_sse(
            client, "/v1/chat/completions", body, lambda c: (c["choices"][0].get("delta") or {}).get("content")
        )

    return one


def _read_sse(client: Any, path: str, body: dict[str, Any], text_of: Callable[[dict], Any]) -> _Sample:
    """POST `body` to `path`, read the SSE stream: time to the first text, the decode rate, the usage count."""
    t0 = time.perf_counter()
    first = last = None
    tokens = prompt_tokens = 0
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return _Sample(0, 0.0, 0.0, 0.0, f"HTTP {r.status_code}: {r.read().decode()[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and text_of(chunk):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    if first is None or last is None:
        return _Sample(tokens, 0.0, 0.0, 0.0, "the stream carried no text")
    ttft = first - t0
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return _Sample(tokens, ttft, prompt_tokens / ttft if ttft > 0 else 0.0, decode)


def _over_http(url: str, w: Workload) -> Callable[[tuple[int, ...], int, int], _Sample]:
    """The same request as a streaming POST /v1/completions with token ids (what an OpenAI client sends)."""
    import httpx  # lazy: heavy: httpx

    local = threading.local()

    def one(prompt: tuple[int, ...], seed: int, priority: int) -> _Sample:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, timeout=600)
        body = {
            "model": "bench",
            "priority": priority,
            "prompt": list(prompt),
            "max_tokens": w.gen_tokens,
            "temperature": w.temperature,
            "seed": seed,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        return _read_sse(client, "/v1/completions", body, lambda c: c["choices"][0].get("text"))

    return one


def worker(w: Workload) -> None:
    """Run the workload in this process (a fresh one) and print JSON lines (see the module docstring).
    With extra["http"], every level runs again through hearth's server on 127.0.0.1 (rows "<backend>+http")."""
    t0 = time.perf_counter()
    target_ms = float(w.extra.get("ttft_target_ms", 500.0))
    priorities = list(w.extra.get("priorities") or [0])  # request i runs at priorities[i % len]
    try:
        settings = load_settings(
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
        loaded = open_backend(settings, command="bench")
    except Exception as e:  # noqa: BLE001 - any load failure becomes one line in the table, not a dead run
        _emit({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return
    load_s = time.perf_counter() - t0
    backend = loaded.backend
    specials = set(loaded.spec.eos_token_ids)
    if loaded.spec.bos_token_id is not None:
        specials.add(loaded.spec.bos_token_id)
    vocab = loaded.spec.vocab_size
    remote = w.backend == "remote"  # the model is on a server: text prompts, its memory is not ours to measure
    chat = bool(w.extra.get("chat")) and not remote  # text prompts as one user message, through the template
    local = _chat(backend, w, remote=remote) if remote or chat else _in_process(backend, w)
    modes: list[tuple[str, Any]] = [(w.backend, local)]
    server = None
    if w.extra.get("http") and not remote:
        server = BackgroundServer(
            backend, "bench", limits={"max_concurrency": max(w.concurrency), "queue_limit": max(64, w.requests)}
        )
        modes.append((f"{w.backend}+http", _over_http_chat(server.url, w) if chat else _over_http(server.url, w)))
    total = len(modes) * len(w.concurrency) * w.requests
    done = 0
    lock = threading.Lock()
    in_process: dict[int, float] = {}  # aggregate tokens/s by concurrency, in this process
    one_stream: float | None = None  # decode tokens/s of one stream, for this GPU's records (_record_decode)
    try:
        for mode, (name, run_one) in enumerate(modes):
            for level, conc in enumerate(w.concurrency):
                # Fresh prompts per level and path: a backend with a prefix cache must not get earlier
                # prompts for free (the same seed gives the same prompts on every backend).
                level_seed = w.seed + 7919 * level + 104729 * mode
                prompts: list[Any] = (
                    synthetic_texts(w.requests, w.prompt_tokens, level_seed)
                    if remote or chat
                    else synthetic_prompts(vocab, specials, w.requests, w.prompt_tokens, level_seed)
                )

                def one(i: int) -> _Sample:
                    nonlocal done
                    sample = run_one(prompts[i], w.seed + i, priorities[i % len(priorities)])
                    with lock:
                        done += 1
                        _emit({"progress": done, "total": total})
                    return sample

                start = time.perf_counter()
                with ThreadPoolExecutor(max_workers=conc) as pool:
                    samples = list(pool.map(one, range(w.requests)))
                wall = time.perf_counter() - start
                errors = [s.error for s in samples if s.error]
                short = [s.tokens for s in samples if s.tokens != w.gen_tokens]
                if errors or short:
                    _emit(
                        {
                            "result": {
                                "backend": name,
                                "concurrency": conc,
                                "error": errors[0] if errors else f"generated {short[0]} tokens, not {w.gen_tokens}",
                            }
                        }
                    )
                    continue
                ttft = [s.ttft_s * 1000 for s in samples]
                aggregate = sum(s.tokens for s in samples) / wall
                result = {
                    "backend": name,
                    "concurrency": conc,
                    "load_s": load_s,
                    "ttft_ms_p50": percentile(ttft, 50),
                    "ttft_ms_p95": percentile(ttft, 95),
                    "ttft_target_ms": target_ms,
                    "ttft_met_pct": 100 * sum(t <= target_ms for t in ttft) / len(ttft),
                    "ttft_by_priority": ttft_by_priority(
                        ttft, [priorities[i % len(priorities)] for i in range(w.requests)], target_ms
                    ),
                    "prefill_tokens_per_s": statistics.mean(s.prefill_tokens_per_s for s in samples),
                    "decode_tokens_per_s": statistics.mean(s.decode_tokens_per_s for s in samples),
                    "aggregate_tokens_per_s": aggregate,
                    # the process that holds the model (the runner): its own VmHWM, loading's peak included
                    "peak_rss_mib": None if remote else backend.stats().peak_rss_bytes / 2**20,
                    "peak_gpu_mib": None if remote else (backend.stats().gpu_bytes / 2**20) or None,
                    "wall_s": wall,
                    # the torch engine's CPU threads at the end of the level (it adapts them: threads.py)
                    "cpu_threads": _cpu_threads(backend),
                    "requests": w.requests,
                    "prompt_tokens": w.prompt_tokens,
                    "gen_tokens": w.gen_tokens,
                }
                if mode == 0:
                    in_process[conc] = aggregate
                    if conc == 1:
                        one_stream = result["decode_tokens_per_s"]
                elif conc in in_process:
                    result["http_vs_in_process"] = aggregate / in_process[conc]
                _emit({"result": result})
        if not remote and one_stream is not None:
            _record_decode(loaded, one_stream, in_process.get(16))
    finally:
        if server is not None:
            server.stop()
        backend.close()


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
