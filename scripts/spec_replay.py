"""Prompt lookup's policy on recorded replies, without timing noise (issue 26): how many steps, of what size.

Verification is draw-and-compare (backends/torch_engine/speculative/verify.py): a seeded reply is the same text
with and without speculation, and a proposal is accepted exactly when it equals the reply's token there.  So a
reply recorded once with speculation off tells what any proposal policy would accept: this script records the
bench's replies (scripts/bench_speculative.py's prompts and seeds) with the real model, then replays each through
the real Engine, Speculator, prompt lookup and adaptive k, with a runner that answers the recorded next token
(as a one-hot row) and step costs from a cost curve (milliseconds of a step of M tokens, M = 1..9: what
scripts/bench_verify_rows.py measures; the default is its "quantized" column on a 2-core Intel Xeon, prefix 128).
It prints tokens per step, the steps' mix, the accepted lengths, and the modelled speed-up over plain decoding
(tokens x cost(1) / the steps' summed cost): a policy change is judged here on the same texts, and then with
the real benchmark.

    python scripts/spec_replay.py --record replies.json           # record (the model, ~1-2 minutes)
    python scripts/spec_replay.py --replay replies.json           # replay with the engine's policy
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_speculative import prompts

# milliseconds of a step of M = 1..9 tokens (scripts/bench_verify_rows.py "quantized", Intel Xeon 2 cores)
DEFAULT_CURVE = (14.22, 16.71, 18.25, 18.21, 23.31, 23.63, 23.91, 25.82, 30.92)


def record(path: str, gen: int, seed_sets: int) -> None:
    # lazy: torch and the model, only when recording
    from app.store import starter_model_path
    from backends.api import LoadOptions, Request, SamplingParams
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    backend = TorchBackend(load_spec(starter_model_path()), LoadOptions(n_ctx=2048, max_num_seqs=16))
    backend.load()
    replies = []
    try:
        for greedy, seeds in ((False, range(seed_sets)), (True, range(1))):  # greedy: one reply per prompt
            for task, texts in prompts().items():
                for s in seeds:
                    for i, text in enumerate(texts):
                        seed = 1000 + i + 100 * s  # the bench's seeds first
                        sp = SamplingParams(temperature=0.0 if greedy else 0.7, seed=seed, max_tokens=gen)
                        ids = tuple(backend.tokenize(text))
                        c = backend.generate(Request(prompt_token_ids=ids, sampling=sp))
                        replies.append({"task": task, "greedy": greedy, "prompt": ids, "reply": c.token_ids})
    finally:
        backend.close()
    Path(path).write_text(json.dumps(replies))


class ReplayRunner:
    """Logits that pick the recorded next token after every position of every row (one-hot rows)."""

    def __init__(self, texts: dict[str, list[int]], vocab: int) -> None:
        self.texts = texts  # request id -> prompt + reply
        self.vocab = vocab
        self.steps: list = []

    def execute(self, out):
        # lazy: torch, only for the replay
        import torch

        from backends.torch_engine.seams import RunnerOutput

        self.steps.append(out)

        def row(rid: str, position: int) -> torch.Tensor:
            text = self.texts[rid]
            r = torch.zeros(self.vocab)
            r[text[position + 1] if position + 1 < len(text) else 0] = 30.0
            return r

        ids, rows, spec = [], [], {}
        for s in out.scheduled:
            if not s.needs_logits:
                continue
            ids.append(s.request_id)
            rows.append(row(s.request_id, s.end_position - 1))
            if s.num_spec_tokens:
                first = s.end_position - s.num_spec_tokens - 1
                spec[s.request_id] = torch.stack([row(s.request_id, p) for p in range(first, s.end_position)])
        return RunnerOutput(tuple(ids), torch.stack(rows), spec_logits=spec)


def replay(item: dict, curve: list[float], k_max: int) -> dict:
    # lazy: torch, only for the replay
    from backends.api import SamplingParams
    from backends.torch_engine.block_manager import BlockManager
    from backends.torch_engine.engine import Engine
    from backends.torch_engine.request import EngineRequest
    from backends.torch_engine.sampler import Sampler
    from backends.torch_engine.scheduler import Scheduler
    from backends.torch_engine.speculative.ngram import NgramProposer
    from backends.torch_engine.speculative.proposer import SpecConfig
    from backends.torch_engine.speculative.speculator import Speculator

    prompt, reply = list(item["prompt"]), list(item["reply"])
    vocab = max(prompt + reply) + 1
    config = SpecConfig("ngram", k_max=k_max, k_start=min(4, k_max))
    spec = Speculator(NgramProposer(config.ngram_max, config.ngram_min), config)
    spec.costs.seconds = {m + 1: ms / 1000 for m, ms in enumerate(curve)}
    spec.observe = lambda out, seconds: None  # the curve is the cost: no wall-clock timings
    runner = ReplayRunner({"r": prompt + reply}, vocab)
    engine = Engine(runner, Scheduler(BlockManager(512), 4, 512, 4096), Sampler(0), spec)
    request = EngineRequest("r", tuple(prompt), SamplingParams(temperature=0, max_tokens=len(reply)))
    engine.add_request(request)
    while engine.has_work:
        engine.step()
    assert request.output_token_ids == reply, "the replay did not reproduce the recorded reply"
    request_steps = runner.steps[1:]  # the first step is the prompt
    sizes = [sum(s.num_tokens for s in step.scheduled) for step in request_steps]
    cost = sum(curve[min(n, len(curve)) - 1] for n in sizes)
    return {
        "tokens": len(reply) - 1,  # the first token comes from the prompt step
        "steps": len(sizes),
        "cost_ms": cost,
        "plain_ms": (len(reply) - 1) * curve[0],
        "verifications": [(n - 1) for n in sizes if n > 1],
        "accepted": spec.num_accepted,
        "proposed": spec.num_proposed,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", default=None, help="record the replies into this JSON file")
    ap.add_argument("--replay", default=None, help="replay the replies of this JSON file")
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--seed-sets", type=int, default=1, help="sampled replies per prompt (seeds 1000 + i + 100 s)")
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--curve", type=float, nargs="+", default=list(DEFAULT_CURVE), help="ms per step, M = 1..9")
    args = ap.parse_args()
    if args.record:
        record(args.record, args.gen, args.seed_sets)
    if not args.replay:
        return 0
    items = json.loads(Path(args.replay).read_text())
    groups: dict[tuple[str, bool], list[dict]] = collections.defaultdict(list)
    for item in items:
        groups[(item["task"], item["greedy"])].append(replay(item, args.curve, args.k_max))
    for (task, greedy), rs in sorted(groups.items()):
        tokens = sum(r["tokens"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        v = [k for r in rs for k in r["verifications"]]
        accepted, proposed = sum(r["accepted"] for r in rs), sum(r["proposed"] for r in rs)
        speedup = sum(r["plain_ms"] for r in rs) / sum(r["cost_ms"] for r in rs)
        each = " ".join(f"{r['plain_ms'] / r['cost_ms']:.2f}" for r in rs)
        print(
            f"{task:8s} {'greedy' if greedy else 't=0.7 ':6s}: {tokens} tokens in {steps} steps "
            f"({tokens / steps:.2f}/step), {len(v)} verifications, acceptance {accepted / max(proposed, 1):.3f}, "
            f"k {dict(sorted(collections.Counter(v).items()))}, modelled x{speedup:.2f} "
            f"(per reply {each})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
