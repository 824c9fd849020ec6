"""Where a speculative decode's time goes (issue 26): one stream, the bench's prompts, each engine phase timed.

Loads the torch engine with speculation off and with prompt lookup (as scripts/bench_speculative.py does), wraps
the engine's phases in timers on the engine thread, and prints per generated token: scheduling, the proposal
(prompt lookup's index and lookup), the speculator's choice of k, the forward, the verify rows' draw and
acceptance, the plain rows' sampling, the scheduler's update (KV rollback included, also shown alone), and the
rest of the step; then how the steps went: speculative rows, plain decodes and why they did not speculate
(back-off, no proposal, the cost model said no), and the distribution of accepted lengths per verification.
Wall time (perf_counter): the forward's OpenMP team works on other threads, so thread CPU time would miss it.

    python scripts/profile_speculative.py                     # sampled t=0.7 seeded, grounded prompts, 48 tokens
    python scripts/profile_speculative.py --greedy --tasks grounded chat --rounds 2
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_speculative import prompts


class Probe:
    """What the wrappers count into: seconds and calls per phase (nested phases are timed too, their parents
    include them), and how the steps went for the one stream.  `current` is swapped per (task, method)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.verifications: list[tuple[int, int]] = []  # (proposed, accepted) per speculative row
        self.backoff = 0  # decode steps skipped by a back-off
        self.declined = 0  # the cost model chose k = 0
        self.empty = 0  # the proposer had nothing
        self.tokens = 0
        self.decode_s = 0.0
        self.by_size: dict[int, list[float]] = collections.defaultdict(list)  # step tokens -> forward seconds


current = Probe()


def timed(owner, attr: str, name: str) -> None:
    """Replace owner.attr by a wrapper that adds its wall time to current.seconds[name]."""
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            current.seconds[name] += time.perf_counter() - t0
            current.calls[name] += 1

    setattr(owner, attr, wrapper)


def instrument(engine) -> None:
    """Wrap one loaded engine's phases (once; they count into whatever `current` is)."""
    timed(engine, "step", "step")
    timed(engine.scheduler, "schedule", "schedule")
    timed(engine.runner, "execute", "forward")
    execute = engine.runner.execute

    def execute_by_size(out):  # the forward's wall time by the step's token count (the cost curve cost.py sees)
        t0 = time.perf_counter()
        try:
            return execute(out)
        finally:
            current.by_size[out.total_num_tokens].append(time.perf_counter() - t0)

    engine.runner.execute = execute_by_size
    timed(engine.sampler, "sample", "sample (plain rows)")
    timed(engine.scheduler, "update", "update (bookkeeping)")
    timed(engine.scheduler.block_manager, "trim", "  of which KV rollback (trim)")
    step = engine.step

    def counted():
        updates = step()
        current.tokens += sum(len(u.new_token_ids) for u in updates)
        return updates

    engine.step = counted
    spec = engine.speculator
    if spec is None:
        return
    timed(spec, "expand", "expand (proposal + k)")
    timed(spec.proposer, "propose", "  of which proposer")
    timed(engine.sampler, "sample_ahead", "  of which verify draw")
    verify = spec.verify

    def verify_counted(result, scheduled, scheduler, sampler):
        t0 = time.perf_counter()
        tokens = verify(result, scheduled, scheduler, sampler)
        current.seconds["verify (draw + accept)"] += time.perf_counter() - t0
        current.calls["verify (draw + accept)"] += 1
        for rid, row in tokens.items():
            current.verifications.append((len(spec._proposals[rid].token_ids), len(row) - 1))
        return tokens

    spec.verify = verify_counted
    propose = spec.proposer.propose

    def propose_counted(requests, ks):
        out = propose(requests, ks)
        current.empty += sum(1 for p in out if not p.token_ids)
        return out

    spec.proposer.propose = propose_counted


def instrument_classes() -> None:
    """The cost model's k and the back-off, counted where the speculator calls them (module-level names)."""
    # lazy: the engine's modules, imported after the model is loaded
    from backends.torch_engine.speculative import speculator as speculator_module
    from backends.torch_engine.speculative.proposer import SpecState

    best_k = speculator_module.best_k

    def best_k_counted(*args):
        k, gain = best_k(*args)
        current.declined += k == 0
        return k, gain

    speculator_module.best_k = best_k_counted
    wants = SpecState.wants

    def wants_counted(self):
        ok = wants(self)
        current.backoff += not ok
        return ok

    SpecState.wants = wants_counted


def report(method: str, task: str, probe: Probe) -> None:
    n = max(probe.tokens, 1)
    total = probe.seconds["step"]
    steps = probe.calls["step"]
    print(
        f"\n== {task} / {method}: {probe.tokens} tokens, {steps} steps, {n / total:.1f} tok/s over the steps' "
        f"time (decode {probe.decode_s:.2f} s)"
    )
    top = [
        "schedule",
        "expand (proposal + k)",
        "forward",
        "verify (draw + accept)",
        "sample (plain rows)",
        "update (bookkeeping)",
    ]
    for name in top + sorted(k for k in probe.seconds if k.startswith(" ")):
        if name not in probe.seconds:
            continue
        s, calls = probe.seconds[name], probe.calls[name]
        print(
            f"  {name:32s} {1000 * s / n:7.3f} ms/token {1000 * s / max(calls, 1):7.3f} ms/call "
            f"{100 * s / total:5.1f}%  ({calls} calls)"
        )
    rest = total - sum(probe.seconds.get(k, 0.0) for k in top)
    print(f"  {'rest of step':32s} {1000 * rest / n:7.3f} ms/token {'':15s} {100 * rest / total:5.1f}%")
    sizes = sorted(n for n in probe.by_size if n < 16)  # decode and verify steps (a prompt step is longer)
    if sizes:
        one = statistics.median(probe.by_size[1]) if 1 in probe.by_size else None
        curve = ", ".join(
            f"{n}: {1000 * statistics.median(probe.by_size[n]):.1f} ms"
            + (f" x{statistics.median(probe.by_size[n]) / one:.2f}" if one else "")
            + f" ({len(probe.by_size[n])})"
            for n in sizes
        )
        print(f"  forward by step tokens (median): {curve}")
    v = probe.verifications
    if v:
        proposed = sum(p for p, _ in v)
        accepted = sum(a for _, a in v)
        print(
            f"  verifications {len(v)}, plain decode steps {steps - len(v)} (back-off {probe.backoff}, no proposal "
            f"{probe.empty}, cost model k=0 {probe.declined}); acceptance {accepted / max(proposed, 1):.3f}; "
            f"tokens per verification {(accepted + len(v)) / len(v):.2f}"
        )
        by_k = collections.Counter(p for p, _ in v)
        lengths = collections.Counter(a for _, a in v)
        print(f"  k proposed: {dict(sorted(by_k.items()))}; accepted lengths: {dict(sorted(lengths.items()))}")
        full = sum(1 for p, a in v if a == p)
        print(f"  all accepted in {full} of {len(v)}; nothing accepted in {lengths.get(0, 0)}")


def main() -> int:
    # lazy: heavy (torch), only for the run
    from app.store import starter_model_path
    from backends.api import LoadOptions, Request, SamplingParams
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    global current
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=1, help="each method's prompts run this many times (interleaved)")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--tasks", nargs="+", default=["grounded"], choices=["grounded", "chat"])
    ap.add_argument("--methods", nargs="+", default=["off", "ngram"], choices=["off", "ngram"])
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    spec = load_spec(starter_model_path())
    backends = {}
    for m in args.methods:
        b = TorchBackend(spec, LoadOptions(n_ctx=2048, max_num_seqs=16, speculative=m, n_threads=args.threads or None))
        b.load()
        instrument(b._engine)
        backends[m] = b
    instrument_classes()
    probes = {(task, m): Probe() for task in args.tasks for m in args.methods}
    for task in args.tasks:
        for _ in range(args.rounds):
            for m in args.methods:
                current = probes[(task, m)]
                for i, text in enumerate(prompts()[task]):
                    sp = SamplingParams(temperature=0.0 if args.greedy else 0.7, seed=1000 + i, max_tokens=args.gen)
                    c = backends[m].generate(Request(prompt_token_ids=tuple(backends[m].tokenize(text)), sampling=sp))
                    current.decode_s += c.stats.decode_s
    for b in backends.values():
        b.close()
    print(
        f"CPU: {platform.processor() or platform.machine()}; load average {os.getloadavg()}; "
        f"{'greedy' if args.greedy else 't=0.7 seeded'}; {args.gen} tokens; rounds {args.rounds}"
    )
    for (task, m), probe in probes.items():
        report(m, task, probe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
