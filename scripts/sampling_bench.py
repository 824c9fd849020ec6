"""What sampling costs a batch (issue 24, item 1): 16 streaming chat clients on hearth's server with the torch
engine, greedy against temperature 0.8 without and with a seed per request, as OpenAI clients send them.

One model load (in a runner process, as `hearth serve` loads it) serves every round; each round runs the three
modes back to back with fresh prompts (no prefix-cache help), so the ratios compare runs made within the same
minute of a shared machine.  Target: temperature 0.8 with seeds at least 90 % of greedy's tokens/s.

    python scripts/sampling_bench.py                                  # starter, 16 clients, 128 tokens, 3 rounds
    python scripts/sampling_bench.py --clients 16 --gen 128 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = (("greedy", 0.0, False), ("t=0.8", 0.8, False), ("t=0.8+seed", 0.8, True))


def run_mode(url: str, prompts: list[str], gen: int, temperature: float, seeded: bool) -> tuple[float, int]:
    """(wall seconds, completion tokens) for every prompt sent at once as a streaming chat request."""
    import httpx

    from app.bench import _read_sse

    local = threading.local()

    def one(i: int) -> int:
        client = getattr(local, "client", None) or httpx.Client(base_url=url, timeout=600)
        local.client = client
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": prompts[i]}],
            "max_tokens": gen,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            **({"seed": 1000 + i} if seeded else {}),
        }
        sample = _read_sse(
            client, "/v1/chat/completions", body, lambda c: (c["choices"][0].get("delta") or {}).get("content")
        )
        if sample.error:
            raise RuntimeError(sample.error)
        return sample.tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        tokens = sum(pool.map(one, range(len(prompts))))
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)

    from app.bench import synthetic_texts
    from app.loading import open_backend
    from app.server.background import BackgroundServer
    from app.settings import load_settings

    settings = load_settings(model=args.model, backend="torch", max_concurrency=args.clients, ctx=1024)
    loaded = open_backend(settings, serving=True, command="serve")
    server = BackgroundServer(loaded.backend, "bench", limits={"max_concurrency": args.clients, "queue_limit": 64})
    rows: list[dict] = []
    try:
        for r in range(args.rounds):
            for m, (name, temperature, seeded) in enumerate(MODES):
                prompts = synthetic_texts(args.clients, args.prompt_words, 7919 * r + 104729 * m + 1)
                wall, tokens = run_mode(server.url, prompts, args.gen, temperature, seeded)
                rows.append({"round": r, "mode": name, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall})
                print(f"round {r} {name:12s} {tokens / wall:7.1f} tok/s ({tokens} tokens, {wall:.1f} s)", flush=True)
    finally:
        server.stop()
        loaded.backend.close()
    by = {name: [x["tokens_per_s"] for x in rows if x["mode"] == name] for name, _, _ in MODES}
    ratios = {
        name: [s / g for s, g in zip(by[name], by["greedy"])] for name, _, _ in MODES if name != "greedy"
    }  # per round: the same minute
    for name, values in ratios.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name} / greedy per round: {each} (median {statistics.median(values):.2f})")
    if args.json:
        info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
        out = {"machine": {"cpu": cpu or platform.processor()}, "rows": rows, "ratios": ratios, "args": vars(args)}
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
