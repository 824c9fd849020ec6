"""Deciding speculative decoding for a plan (pure: no model files, no torch).

`--speculative auto` (issue 26): a draft model only when one with the target's vocabulary is local (the app
finds it and passes its shape) and fits beside the target on the plan's device; else prompt lookup, which needs
no memory and, with the engine's per-request back-off, costs almost nothing where it does not pay; never on
llama.cpp (the torch engine's feature: llama.cpp's own speculation is not wired into llama-cpp-python's server
path here).  An explicit `draft` that does not fit is a PlanError with the numbers.

The draft's memory is priced into the plan's device (plan = allocation): its weights (the file's tensor bytes)
and its own KV pool, which the engine sizes like the target's default, max_num_seqs sequences of ctx tokens.
"""

from __future__ import annotations

import dataclasses

from hwprobe.errors import PlanError
from hwprobe.memory import TORCH_KV_BLOCK_TOKENS, kv_bytes_per_token, mib
from hwprobe.plan_types import Plan, SpeculativePlan
from hwprobe.shape import ModelShape

K_NGRAM = 8  # prompt lookup's most proposals per step (cheap guesses; k adapts below it)
K_DRAFT = 4  # a draft model's (each proposal costs a draft forward)


def draft_bytes(draft: ModelShape, ctx: int, max_num_seqs: int) -> tuple[int, int]:
    """(weights, KV pool) bytes the engine holds for a draft model."""
    weights = draft.weight_bytes or int(draft.estimated_param_count() * 2)
    blocks = max(max_num_seqs, 1) * -(-ctx // TORCH_KV_BLOCK_TOKENS)
    return weights, blocks * TORCH_KV_BLOCK_TOKENS * kv_bytes_per_token(draft, "f16")


def plan_speculative(
    plan: Plan, asked: str, draft: ModelShape | None = None, draft_name: str | None = None, k: int | None = None
) -> Plan:
    """The plan with its `speculative` decided (and the draft's memory added to the device it runs on)."""
    if asked == "off":
        return dataclasses.replace(plan, speculative=SpeculativePlan(reason="off (--speculative off)"))
    if plan.backend != "torch":
        why = "off: speculative decoding is the torch engine's (this plan runs llama.cpp)"
        if asked != "auto":
            raise PlanError(
                f"--speculative {asked} needs the torch engine, the plan chose {plan.backend}", "add --backend torch"
            )
        return dataclasses.replace(plan, speculative=SpeculativePlan(reason=why))
    if draft is not None and asked in ("draft", "auto"):
        weights, kv = draft_bytes(draft, plan.ctx, plan.max_num_seqs)
        on_gpu = plan.device.startswith("cuda")
        devices = list(plan.devices)
        index = next((i for i, d in enumerate(devices) if (d.kind == "gpu") == on_gpu and (not on_gpu or d.used)), None)
        if index is not None:
            d = devices[index]
            grown = dataclasses.replace(d, weights_mib=d.weights_mib + mib(weights), kv_mib=d.kv_mib + mib(kv))
            if grown.headroom_mib >= 0:
                devices[index] = grown
                sp = SpeculativePlan(
                    "draft",
                    k or K_DRAFT,
                    draft_name,
                    mib(weights),
                    mib(kv),
                    f"draft model {draft_name}: {mib(weights)} MiB weights + {mib(kv)} MiB KV beside the target",
                )
                return dataclasses.replace(plan, devices=tuple(devices), speculative=sp)
            if asked == "draft":
                raise PlanError(
                    f"the draft model {draft_name} needs {mib(weights) + mib(kv)} MiB (weights {mib(weights)} + KV "
                    f"{mib(kv)} at {plan.max_num_seqs} x {plan.ctx} tokens) beside the target, "
                    f"{max(d.headroom_mib, 0)} MiB are left on {d.name}",
                    "use a smaller draft, lower --ctx or --max-concurrency, or --speculative ngram",
                )
    if asked == "draft":
        raise PlanError("--speculative draft needs a draft model", "add --draft-model NAME|PATH")
    why = "prompt lookup (n-gram guesses from the prompt and the reply; k adapts per request)"
    if asked == "auto":
        why += ": no local draft model with this vocabulary fits" if draft is None else ": the draft does not fit"
    return dataclasses.replace(plan, speculative=SpeculativePlan("ngram", k or K_NGRAM, None, 0, 0, why))
