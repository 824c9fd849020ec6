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

# Input-grounded prompts: texts the reply must copy with small changes.  They are fixed here (not read from the
# repository's files, which change) and short: the starter (135M) ignores "repeat this code" on a page of code
# and writes about it instead (such prompts gave ~0.4 acceptance, mostly from its own repetition), but it does
# copy a paragraph or a short function when asked to fix, copy or rename in it.
_TEXT_A = (
    "The lighthouse stood on a rock at the edge of the bay. Every evening the keeper climbed the one hundred and "
    "twelve steps to the lamp room, cleaned the glass, trimed the wick and lit the lamp. Ships that passed in the "
    "night saw the beam turn once every ten seconds and knew were they were."
)
_TEXT_B = (
    "To install the package, create a virtual environment, activate it, and run pip install with the name of the "
    "package. The first run downloads the model weights, which can take several minutes on a slow connection. "
    "After that the program starts in under a second and works offline."
)
_TEXT_C = (
    "Bread needs only four things: flour, water, salt and yeast. Mix them, knead the dough for ten minutes, and "
    "let it rise untill it has doubled in size. Shape the loaf, let it rise again, and bake it in a hot oven for "
    "about forty minutes, until the crust is brown and the bottom sounds hollow."
)
_CODE = (
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
    "            out.append(b[j])\n            j += 1\n    return out + a[i:] + b[j:]\n"
)


def prompts() -> dict[str, list[str]]:
    grounded = [
        f"Fix the typos in this text and write it out again in full:\n{_TEXT_A}",
        f"Copy this text word for word:\n{_TEXT_B}",
        f"Rename the function merge to merge_sorted and repeat the code:\n{_CODE}",
        f"Fix the typos in this text and write it out again in full:\n{_TEXT_C}",
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
