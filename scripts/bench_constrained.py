"""The cost per token of constrained decoding on the torch engine, at 1 and 16 concurrent requests (issue 17).

Each round runs the same prompts twice on one loaded TorchBackend: free (ignore_eos, exactly --gen tokens) and
constrained by a JSON schema that cannot end before --gen tokens (an array of at least that many strings), so
both generate the same number of tokens in batches of the same size and differ only by the grammar mask and
the matcher's advance.  Rounds alternate free/constrained and the best of --rounds is kept for each (the
machine may be shared).  Target: constrained < 10 % slower per token.

    python scripts/bench_constrained.py                      # starter model, concurrency 1 and 16
    python scripts/bench_constrained.py --concurrency 1 4 16 --gen 64 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 1000}},
    "required": ["items"],
}
PROMPT = (
    "<|im_start|>user\nList as many fruits, vegetables and animals as you can as a JSON array."
    "<|im_end|>\n<|im_start|>assistant\n"
)


def run_batch(backend, n: int, concurrency: int, gen: int, constrained: bool) -> tuple[float, int]:
    """(wall seconds, tokens generated) for n requests, `concurrency` in flight at a time."""
    from backends.api import Constraint, FinishReason, Request, SamplingParams

    constraint = Constraint("json_schema", json.dumps(SCHEMA)) if constrained else None
    tokens = [0] * n
    errors: list[str] = []
    sem = threading.Semaphore(concurrency)

    def one(i: int) -> None:
        with sem:
            c = backend.generate(
                Request(
                    prompt=PROMPT,
                    constraint=constraint,
                    sampling=SamplingParams(temperature=0.8, seed=i, max_tokens=gen, ignore_eos=True),
                )
            )
            tokens[i] = c.stats.completion_tokens
            if c.finish_reason is not FinishReason.LENGTH:
                errors.append(f"request {i}: {c.finish_reason.value} {c.error or ''}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"bench_constrained: a request did not run to --gen tokens: {errors[0]}")
    return wall, sum(tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="GGUF path (default: the starter model)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--gen", type=int, default=64, help="tokens per request")
    p.add_argument(
        "--requests", type=int, default=0, help="requests per measurement (default: 2 x concurrency, at least 4)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: physical cores; on a shared "
        "machine 1 avoids OpenMP threads waiting on each other)",
    )
    p.add_argument("--json", dest="json_out", help="also write the results here")
    args = p.parse_args(argv)
    from app.store import starter_model_path
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    spec = load_spec(args.model or starter_model_path())
    backend = TorchBackend(
        spec,
        LoadOptions(n_ctx=512, n_batch=512, max_num_seqs=max(args.concurrency), device="cpu", n_threads=args.threads),
    )
    backend.load()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    results = []
    try:
        run_batch(backend, 2, 2, 8, True)  # warm-up: compile the schema once, touch every code path
        run_batch(backend, 2, 2, 8, False)
        for c in args.concurrency:
            n = args.requests or max(2 * c, 4)
            best = {False: float("inf"), True: float("inf")}
            for _ in range(args.rounds):
                for constrained in (False, True):
                    wall, tokens = run_batch(backend, n, c, args.gen, constrained)
                    best[constrained] = min(best[constrained], wall / tokens)
            row = {
                "concurrency": c,
                "requests": n,
                "gen_tokens": args.gen,
                "free_ms_per_token": round(best[False] * 1e3, 3),
                "constrained_ms_per_token": round(best[True] * 1e3, 3),
                "free_tokens_per_s": round(1 / best[False], 1),
                "constrained_tokens_per_s": round(1 / best[True], 1),
                "overhead_pct": round((best[True] / best[False] - 1) * 100, 1),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        backend.close()
    print(
        f"\n{spec.name} on {cpu}, torch engine (CPU, {args.threads or 'default'} threads), best of {args.rounds} rounds"
    )
    print(f"{'concurrency':>11} {'free tok/s':>11} {'constrained tok/s':>18} {'overhead':>9}")
    for r in results:
        print(
            f"{r['concurrency']:>11} {r['free_tokens_per_s']:>11} {r['constrained_tokens_per_s']:>18} "
            f"{r['overhead_pct']:>8}%"
        )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"cpu": cpu, "model": spec.name, "threads": args.threads, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
