#!/usr/bin/env python3
"""The grouped expert matmul against the per-token reference on a tiny MoE layer (issue 18's benchmark).

One MoE feed-forward (kernels/moe.py) at a few token counts: the per-token reference loop
(moe_experts_reference), the plain-torch grouped path (tokens sorted by expert, one matmul per used expert:
moe_experts_torch) and, on CUDA, the Triton grouped kernel (one launch over all experts: moe_experts_triton).
Each is checked against the reference before it is timed.  Prints milliseconds per layer call and the speed-up
over the reference.

    python scripts/moe_bench.py                  # CPU: reference vs torch grouped (Triton needs CUDA)
    python scripts/moe_bench.py --device cuda    # adds the Triton kernel
    python scripts/moe_bench.py --dry-run        # tiny shapes, one repeat: proves the script runs
Shapes: hidden 1024, 8 experts of width 1024, top-2 (a Mixtral layer scaled down 4x / 14x); --tokens sets the
token counts (1 is a decode step, the larger ones prefill chunks or batched decodes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hearth's source tree


def _time(fn, repeats: int, sync) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    import torch

    from kernels.moe import moe_experts_reference, moe_experts_torch, route

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--tokens", default="1,16,128")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads (0: torch's default); on a shared, loaded machine 1 gives steadier numbers",
    )
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dry_run:
        args.hidden, args.ffn, args.tokens, args.repeats = 64, 32, "1,5", 1
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    e, h, f = args.experts, args.hidden, args.ffn
    gate_up = (torch.randn(e, 2 * f, h, generator=g) / h**0.5).to(device, dtype)
    down = (torch.randn(e, h, f, generator=g) / f**0.5).to(device, dtype)
    impls = {"reference": moe_experts_reference, "torch grouped": moe_experts_torch}
    if device.type == "cuda":
        from kernels.moe_triton import moe_experts_triton

        impls["triton grouped"] = moe_experts_triton
    print(f"MoE layer: hidden {h}, {e} experts of width {f}, top-{args.top_k}, {args.dtype} on {device}")
    print(f"{'tokens':>7}" + "".join(f"{name:>18}" for name in impls) + "   (ms per call; x = speed-up)")
    for n in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(n, h, generator=g).to(device, dtype)
        weights, ids = route(torch.randn(n, e, generator=g).to(device), args.top_k, normalize=True)
        want = moe_experts_reference(x, gate_up, down, weights, ids).float()
        times = {}
        for name, fn in impls.items():
            got = fn(x, gate_up, down, weights, ids).float()
            err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
            if err > (1e-4 if dtype == torch.float32 else 2e-2):
                raise SystemExit(f"{name} differs from the reference at {n} tokens: relative error {err:.2e}")
            times[name] = _time(lambda fn=fn: fn(x, gate_up, down, weights, ids), args.repeats, sync)
        ref = times["reference"]
        print(f"{n:>7}" + "".join(f"{t:>10.3f} ({ref / t:>4.1f}x)" for t in times.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
