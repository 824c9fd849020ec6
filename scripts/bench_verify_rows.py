"""What a speculative verification row of M tokens costs next to a one-token decode (issue 26), on the CPU.

A row of M = k + 1 tokens (the last sampled token and k proposals) over a cached prefix of --prefix tokens, run
through ModelRunner.forward with logits after every token, for M = 1..9.  Three ways to run the projections:
- "quantized": every row on the packed int4 kernel (what a decode row takes; QUANTIZED_ROWS = M);
- "dense": every row on the layers' dense bf16 copies (what a prompt chunk takes; QUANTIZED_ROWS = 0);
and "head": the vocabulary projection alone on M rows (model.compute_logits), which is part of both.
Prints milliseconds per forward (median of --repeat) and the ratio to the one-token decode.

    python scripts/bench_verify_rows.py                  # starter model, prefix 512, M = 1..9
    python scripts/bench_verify_rows.py --prefix 1024 --repeat 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    import torch

    from app.store import starter_model_path
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner
    from backends.torch_engine.seams import BLOCK_SIZE

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the starter model)")
    ap.add_argument("--prefix", type=int, default=512, help="cached tokens before the row")
    ap.add_argument("--max-rows", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    spec = load_spec(args.model or starter_model_path())
    runner = ModelRunner(spec, LoadOptions(n_ctx=2048, max_num_seqs=1, device="cpu", adaptive_threads=False))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, spec.vocab_size - 100, (args.prefix + args.max_rows,), generator=gen).tolist()
    table = list(range((len(ids) + BLOCK_SIZE - 1) // BLOCK_SIZE))
    runner.forward([(ids[: args.prefix], 0, table)], "last", num_decodes=0)  # the cached prefix
    p = args.prefix

    def row(m: int, quantized: int):
        return lambda: runner.forward([(ids[p : p + m], p, table)], "all", num_decodes=quantized)

    hidden = torch.randn(args.max_rows, spec.hidden_size, dtype=runner.dtype)
    print(f"model {spec.name}; prefix {p}; threads {torch.get_num_threads()}; load average {os.getloadavg()}")
    base = None
    for m in range(1, args.max_rows + 1):
        with torch.inference_mode():
            quant = _median_ms(row(m, m), args.repeat)
            dense = _median_ms(row(m, 0), args.repeat)
            head = _median_ms(lambda: runner.model.compute_logits(hidden[:m]), args.repeat)
        base = base or quant
        print(
            f"M={m}: quantized {quant:7.2f} ms (x{quant / base:.2f})  dense {dense:7.2f} ms (x{dense / base:.2f})"
            f"  head {head:6.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
