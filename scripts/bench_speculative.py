"""Speculative decoding on the torch engine (issue 26): decode tok/s with each method, single stream and at 16
clients, on input-grounded tasks (summarise / quote / edit a given text or code: prompt lookup's case) and on
free chat.  One TorchBackend per method (off, ngram, and draft when --draft-model is given), the same prompts,
sampled at temperature 0.7 with fixed seeds (as users run it; greedy with --greedy), max --gen tokens each.
Decode tok/s = generated tokens after the first / time after the first token, summed over requests (single
stream) or wall-clock for the batch (16 clients).  Rounds alternate methods; the best round is kept (the machine
may be shared: print `uptime` beside the numbers).

    python scripts/bench_speculative.py                          # starter model, off vs ngram, 1 and 16 clients
    python scripts/bench_speculative.py --draft-model small.gguf --model big.gguf --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def _snippet(path: str, start: int, n: int) -> str:
    return (ROOT / path).read_text(encoding="utf-8")[start : start + n]


def prompts() -> dict[str, list[str]]:
    code = _snippet("backends/torch_engine/block_manager.py", 3500, 900)
    text = _snippet("README.md", 0, 1200)
    grounded = [
        f"Repeat this code exactly, adding a comment on the first line:\n{code}",
        f"Quote the first three sentences of this text word for word:\n{text}",
        f"Rename every variable called block to blk in this code and show all of it:\n{code}",
        f"Summarise this text, quoting its key phrases:\n{text}",
    ]
    chat = [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain why the sky is blue to a ten-year-old.",
        "Give me five ideas for a weekend trip in the mountains and why each is good.",
        "What are the pros and cons of working from home?",
    ]
    wrap = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    return {"grounded": [wrap.format(p) for p in grounded], "chat": [wrap.format(p) for p in chat]}


def run(backend, texts: list[str], clients: int, gen: int, greedy: bool) -> dict[str, float]:
    from backends.api import Request, SamplingParams

    jobs = [texts[i % len(texts)] for i in range(max(clients, len(texts)))]
    results = []
    lock = threading.Lock()

    def one(i: int, text: str) -> None:
        sp = SamplingParams(temperature=0.0 if greedy else 0.7, seed=1000 + i, max_tokens=gen)
        c = backend.generate(Request(prompt_token_ids=tuple(backend.tokenize(text)), sampling=sp))
        with lock:
            results.append(c.stats)

    t0 = time.perf_counter()
    if clients == 1:
        for i, text in enumerate(jobs):
            one(i, text)
    else:
        threads = [threading.Thread(target=one, args=(i, t)) for i, t in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    tokens = sum(s.completion_tokens for s in results)
    decode_s = sum(s.decode_s for s in results)
    proposed = sum(s.spec_proposed_tokens for s in results)
    accepted = sum(s.spec_accepted_tokens for s in results)
    single = sum(s.completion_tokens - 1 for s in results) / decode_s if decode_s else 0.0
    return {
        "decode_tok_s": round(single if clients == 1 else tokens / wall, 2),
        "tokens": tokens,
        "acceptance": round(accepted / proposed, 3) if proposed else 0.0,
        "accepted_per_token": round(accepted / tokens, 3) if tokens else 0.0,
    }


def main() -> int:
    from app.store import starter_model_path
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the starter model)")
    ap.add_argument("--draft-model", default=None, help="also measure --speculative draft with this GGUF")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--tasks", nargs="+", default=["grounded", "chat"], choices=["grounded", "chat"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    spec = load_spec(args.model or starter_model_path())
    methods = ["off", "ngram"] + (["draft"] if args.draft_model else [])
    best: dict[tuple[str, str, int], dict] = {}
    backends = {}
    for m in methods:
        extra = {"draft_model": args.draft_model} if m == "draft" else {}
        options = LoadOptions(n_ctx=2048, max_num_seqs=16, speculative=m, n_threads=args.threads or None, **extra)
        b = TorchBackend(spec, options)
        b.load()
        backends[m] = b
    for _ in range(args.rounds):
        for task, texts in prompts().items():
            if task not in args.tasks:
                continue
            for clients in args.clients:
                for m in methods:
                    r = run(backends[m], texts, clients, args.gen, args.greedy)
                    key = (task, m, clients)
                    if key not in best or r["decode_tok_s"] > best[key]["decode_tok_s"]:
                        best[key] = r
    for b in backends.values():
        b.close()
    print(f"CPU: {platform.processor() or platform.machine()}; load average {os.getloadavg()}")
    rows = []
    for (task, m, clients), r in sorted(best.items()):
        off = best[(task, "off", clients)]["decode_tok_s"]
        ratio = r["decode_tok_s"] / off if off else 0.0
        rows.append({"task": task, "method": m, "clients": clients, **r, "vs_off": round(ratio, 2)})
        print(
            f"{task:8s} {m:6s} clients {clients:2d}: {r['decode_tok_s']:8.2f} tok/s  x{ratio:.2f} vs off  "
            f"acceptance {r['acceptance']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
