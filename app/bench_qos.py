"""The quality-of-service benchmark (issue 27): a person chatting while batch jobs stream on the same engine.

Two phases on one loaded model, each `duration_s` long after `warmup_s` (`--rounds N` alternates them N times,
A B A B ..., so that a shared machine's changing load weighs on both alike; throughputs are then medians):
  A. `bg_clients` background clients at priority 0, each streaming long replies back to back;
  B. the same, plus one interactive client at priority -1 (what `hearth run` and the chat app send) sending a
     new chat turn every `interval_s` seconds.
Reported: the interactive client's TTFT p50/p95 and the share within the target (--ttft-target-ms), and the
background throughput (tokens/s over the measured window) of B against A.  The issue's target on the 2-core
CPU with the starter: interactive p95 under 500 ms, background throughput at least 85% of A's.

Requests are sampled (temperature 0.8) with a seed each, as users run them, and go through the chat template
(`app.requests.chat_request`).  `--http` sends them through hearth's OpenAI server on 127.0.0.1 instead (the
API's `priority` field), which also exercises the server's admission by priority.

    python scripts/bench_qos.py --duration 60            # in process (the runner, as the chat app has it)
    python scripts/bench_qos.py --duration 60 --http     # through the API server
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.bench import percentile, synthetic_texts
from app.loading import open_backend
from app.requests import chat_request
from app.server.background import BackgroundServer
from app.settings import load_settings
from backends.api import EventKind, SamplingParams

CHAT_QUESTIONS = (
    "What is the capital of France?",
    "Give me two tips for sleeping better.",
    "Write a haiku about autumn.",
    "What does a hash table do?",
    "Name three rivers in Africa.",
    "How do I boil an egg?",
)


@dataclass
class Phase:
    """What one phase measured."""

    bg_tokens: int = 0  # background tokens that arrived inside the measured window
    window_s: float = 0.0
    chat_ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def bg_tokens_per_s(self) -> float:
        return self.bg_tokens / self.window_s if self.window_s > 0 else 0.0


Stream = Callable[[str, int, int, int], Any]  # (user text, max_tokens, seed, priority) -> iterator of (t, n)


def _local_stream(backend: Any) -> Stream:
    def stream(text: str, max_tokens: int, seed: int, priority: int):  # type: ignore[no-untyped-def]
        sp = SamplingParams(temperature=0.8, seed=seed, max_tokens=max_tokens, ignore_eos=True)
        req = chat_request(backend.spec, [{"role": "user", "content": text}], sp, priority=priority).request
        for event in backend.stream(req):
            if event.kind is EventKind.TOKEN and event.token_ids:
                yield time.perf_counter(), len(event.token_ids)
            elif event.kind is EventKind.FINISHED and event.error:
                raise RuntimeError(event.error)

    return stream


def _http_stream(url: str) -> Stream:
    import httpx  # lazy: heavy: httpx

    local = threading.local()

    def stream(text: str, max_tokens: int, seed: int, priority: int):  # type: ignore[no-untyped-def]
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, timeout=600)
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0.8,
            "seed": seed,
            "stream": True,
            "ignore_eos": True,
            "priority": priority,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:200]}")
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and (chunk["choices"][0].get("delta") or {}).get("content"):
                        yield time.perf_counter(), 1  # a chunk per token (the server streams one each)

    return stream


def run_phase(stream: Stream, args: argparse.Namespace, interactive: bool, seed0: int) -> Phase:
    phase = Phase()
    lock = threading.Lock()
    start = time.perf_counter()
    window = (start + args.warmup, start + args.warmup + args.duration)
    stop = threading.Event()
    texts = synthetic_texts(4096, args.prompt_words, seed0)

    def background(client: int) -> None:
        k = 0
        while not stop.is_set():
            seed = seed0 + 1000 * client + k
            try:
                for t, n in stream(texts[(client * 97 + k) % len(texts)], args.bg_tokens, seed, 0):
                    if window[0] <= t <= window[1]:
                        with lock:
                            phase.bg_tokens += n
                    if stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - reported, the phase goes on
                with lock:
                    phase.errors.append(f"background: {exc}")
                time.sleep(0.5)
            k += 1

    def chat() -> None:
        k = 0
        next_at = window[0]
        while not stop.is_set() and next_at < window[1]:
            time.sleep(max(next_at - time.perf_counter(), 0))
            sent = time.perf_counter()
            question = CHAT_QUESTIONS[k % len(CHAT_QUESTIONS)] + f" (turn {k})"
            try:
                for t, _ in stream(question, args.chat_tokens, seed0 + 7 + k, args.chat_priority):
                    phase.chat_ttft_s.append(t - sent)
                    break  # the rest of the reply is not waited for: the person reads it as it streams
            except Exception as exc:  # noqa: BLE001
                phase.errors.append(f"interactive: {exc}")
            k += 1
            next_at = sent + args.interval

    threads = [threading.Thread(target=background, args=(i,), daemon=True) for i in range(args.bg_clients)]
    if interactive:
        threads.append(threading.Thread(target=chat, daemon=True))
    for t in threads:
        t.start()
    time.sleep(max(window[1] - time.perf_counter(), 0))
    stop.set()
    phase.window_s = args.duration
    for t in threads:
        t.join(timeout=120)
    return phase


def measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = load_settings(
        model=args.model,
        backend=args.backend,
        ctx=args.ctx,
        max_concurrency=args.bg_clients,
        ttft_target_ms=args.ttft_target_ms,
        threads=args.threads,
    )
    loaded = open_backend(settings)
    server = None
    try:
        stream = _local_stream(loaded.backend)
        if args.http:
            server = BackgroundServer(loaded.backend, "bench", limits={"max_concurrency": args.bg_clients})
            stream = _http_stream(server.url)
        for _ in stream("Hello!", 2, args.seed, 0):  # the first step's one-time costs stay out of both phases
            pass
        bases: list[Phase] = []
        qoses: list[Phase] = []
        for i in range(args.rounds):  # A, B, A, B, ...: a shared machine's load drifts alike over both
            bases.append(run_phase(stream, args, interactive=False, seed0=args.seed + 2 * i))
            qoses.append(run_phase(stream, args, interactive=True, seed0=args.seed + 2 * i + 1))
        stats = loaded.backend.stats()
    finally:
        if server is not None:
            server.stop()
        loaded.backend.close()
    ttft = [t for q in qoses for t in q.chat_ttft_s]
    target_s = args.ttft_target_ms / 1000
    alone = percentile([b.bg_tokens_per_s for b in bases], 50)
    with_chat = percentile([q.bg_tokens_per_s for q in qoses], 50)
    return {
        "backend": args.backend,
        "path": "http" if args.http else "in-process",
        "model": loaded.spec.name,
        "bg_clients": args.bg_clients,
        "interval_s": args.interval,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "ttft_target_ms": args.ttft_target_ms,
        "chat_priority": args.chat_priority,
        "chat_requests": len(ttft),
        "chat_ttft_ms_p50": percentile(ttft, 50) * 1000 if ttft else None,
        "chat_ttft_ms_p95": percentile(ttft, 95) * 1000 if ttft else None,
        "chat_ttft_ms_max": max(ttft) * 1000 if ttft else None,
        "chat_met_target": sum(t <= target_s for t in ttft) / len(ttft) if ttft else None,
        "bg_tokens_per_s_alone": alone,  # the median over the rounds
        "bg_tokens_per_s_with_chat": with_chat,
        "bg_throughput_kept": with_chat / alone if alone else None,
        "bg_kept_by_round": [
            round(q.bg_tokens_per_s / b.bg_tokens_per_s, 3) if b.bg_tokens_per_s else None for b, q in zip(bases, qoses)
        ],
        "preemptions": stats.preemptions,
        "deferred": stats.deferred,
        "errors": [e for p in (*bases, *qoses) for e in p.errors][:5],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_qos", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", "-m", help="model (default: last used, else the starter)")
    p.add_argument("--backend", default="torch", help="torch (default) or llama.cpp")
    p.add_argument("--ctx", type=int, default=1024, help="context per sequence (default 1024)")
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--bg-clients", dest="bg_clients", type=int, default=16, help="background clients (16)")
    p.add_argument("--bg-tokens", dest="bg_tokens", type=int, default=512, help="tokens per background reply (512)")
    p.add_argument("--chat-tokens", dest="chat_tokens", type=int, default=64, help="tokens per chat reply (64)")
    p.add_argument("--prompt-words", dest="prompt_words", type=int, default=96, help="background prompt words (96)")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between two chat turns (3)")
    p.add_argument(
        "--chat-priority",
        dest="chat_priority",
        type=int,
        default=-1,
        help="the interactive client's priority (-1, as hearth run and the chat app; 0 with --ttft-target-ms 0 "
        "measures plain first-come-first-served scheduling for comparison)",
    )
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds per phase (60)")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring (10)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate the two phases this many times (1); medians of the throughputs, every chat turn's TTFT",
    )
    p.add_argument("--ttft-target-ms", dest="ttft_target_ms", type=float, default=500.0, help="(500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--http", action="store_true", help="through hearth's API server on 127.0.0.1")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in ("bg_clients", "bg_tokens", "chat_tokens", "prompt_words"):
        if getattr(args, name) < 1:
            print(f"bench_qos: error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.rounds < 1:
        print("bench_qos: error: --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.duration <= 0 or args.warmup < 0:
        print("bench_qos: error: --interval and --duration must be > 0, --warmup >= 0", file=sys.stderr)
        return 2
    result = measure(args)
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"{key:28} {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
