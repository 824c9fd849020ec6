"""--speculative / --draft-model at the edge: find the draft model and let the planner decide (hwprobe.speculative).

`auto` looks for a draft among the local models (the store's entries): a GGUF with the target's vocabulary
(same size, tokenizer kind, pre-tokenizer, BOS and EOS ids; the engine compares every token's bytes at load) and
at most a third of its parameters (a bigger one would not be cheaper to run than the target's own decode).
"""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings
from app.store import ModelStore
from backends.modelspec import ModelSpec
from hwprobe.plan_types import Plan
from hwprobe.speculative import plan_speculative

DRAFT_MAX_SHARE = 1 / 3  # a draft model's parameters at most this share of the target's


def same_vocabulary(a: ModelSpec, b: ModelSpec) -> bool:
    return (
        a.vocab_size == b.vocab_size
        and a.tokenizer_model == b.tokenizer_model
        and a.tokenizer_pre == b.tokenizer_pre
        and a.bos_token_id == b.bos_token_id
        and a.eos_token_ids == b.eos_token_ids
    )


def find_local_draft(target: ModelSpec, store: ModelStore | None = None) -> ModelSpec | None:
    """The largest local GGUF that can draft for `target`, or None."""
    store = store or ModelStore()
    best: ModelSpec | None = None
    target_params = target.param_count or target.to_shape().estimated_param_count()
    for entry in store.entries():
        if entry.source == "remote" or Path(entry.path) == Path(target.path):
            continue
        try:
            spec = store.spec_for_path(Path(entry.path))
        except Exception:  # noqa: BLE001 - an unreadable entry is simply no candidate
            continue
        params = spec.param_count or spec.to_shape().estimated_param_count()
        if spec.format != "gguf" or not same_vocabulary(target, spec) or params > target_params * DRAFT_MAX_SHARE:
            continue
        if best is None or params > (best.param_count or 0):
            best = spec
    return best


def decide_speculative(plan: Plan, target: ModelSpec, settings: Settings) -> tuple[Plan, str | None]:
    """(the plan with its speculative decision, the draft's path or None)."""
    asked = settings.speculative
    draft: ModelSpec | None = None
    if asked in ("draft", "auto") and plan.backend == "torch":
        if settings.draft_model:
            _, draft = ModelStore().spec(settings.draft_model)
        elif asked == "auto":
            draft = find_local_draft(target)
    plan = plan_speculative(plan, asked, draft.to_shape() if draft else None, draft.name if draft else None)
    return plan, (draft.path if draft is not None and plan.speculative.method == "draft" else None)
