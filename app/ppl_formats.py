"""`hearth ppl --compare-formats`: every format the planner may offer for a model, quantized while loading by the
torch engine, measured against the model's best format on the same windows, and recorded for the planner (issue 41
item 4: "formats are chosen by measured quality loss").

The best format is what the plan takes at `--max-ppl-increase 0` on the torch engine: the 16 bits of a
safetensors folder, a GGUF's own blocks.  The formats are hwprobe.candidates.quantized_formats: those the planner
may offer for the model on a GPU that runs them all (W8A16, FP8, W4A16+attn8, W4A16; for a GGUF only those of at
least its own bits), whatever this machine is: quality does not depend on the card, so a CPU can measure what a GPU
will be planned with.  FP8's reference kernel is too slow on a CPU to be worth a window, so a CPU run leaves it out
and says so.  Each result goes to app/measurements.py under the model's name (`record_quality`), where the plan's
quality budget reads it instead of the documented default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from app.measurements import record_quality
from app.perplexity import perplexity
from app.settings import Settings
from hwprobe.candidates import quantized_formats
from hwprobe.plan_types import Prefs

GPU_ONLY = ("FP8",)  # formats whose CPU path is only the slow reference kernel


def compare_formats(
    settings: Settings,
    token_ids_of: Callable[[Any], list[int]],
    ctx: int,
    stride: int,
    source: str,
    *,
    hardware_file: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Load the model at its best on the torch engine, then each format in turn beside it; the report:
    {"model", "base_format", "perplexity", "tokens", "formats": [{"format", "perplexity", "ppl_increase_pct",
    "kl_mean"}], "skipped": {format: why}}.  `token_ids_of(backend)` tokenizes the text with the model's tokenizer."""
    from app.loading import open_backend  # lazy: keeps `hearth --help` light (+26 hearth modules)

    best = dataclasses.replace(settings, backend="torch", max_ppl_increase=0.0)
    base = open_backend(best, hardware_file=hardware_file, logits_all=True, command="ppl")
    try:
        ids = token_ids_of(base.backend)
        plan = base.decision.plan
        on_gpu = plan is not None and plan.device.startswith("cuda")
        formats = quantized_formats(base.spec.to_shape(), Prefs(backend="torch"))
        skipped = {
            f: "a CPU runs only its reference kernel: measure it on a GPU"
            for f in formats
            if not on_gpu and f in GPU_ONLY
        }
        rows, base_ppl, tokens = [], 0.0, 0
        for fmt in (f for f in formats if f not in skipped):
            other = open_backend(best, hardware_file=hardware_file, logits_all=True, command="ppl", weight_format=fmt)
            try:
                res, res2 = perplexity(base.backend, ids, ctx, stride, other.backend, progress=progress)
            finally:
                other.backend.close()
            assert res2 is not None
            base_ppl, tokens = res.perplexity, res.tokens_scored
            pct = 100 * (res2.perplexity - res.perplexity) / res.perplexity
            why = f"hearth ppl --compare-formats on {source} ({tokens} tokens), against {plan.quant if plan else '?'}"
            record_quality(base.spec.name, fmt, pct, res.kl_mean, why)
            rows.append(
                {
                    "format": fmt,
                    "perplexity": res2.perplexity,
                    "ppl_increase_pct": round(pct, 3),
                    "kl_mean": res.kl_mean,
                }
            )
        if not rows:  # nothing to compare: the base alone
            res, _ = perplexity(base.backend, ids, ctx, stride, progress=progress)
            base_ppl, tokens = res.perplexity, res.tokens_scored
    finally:
        base.backend.close()
    return {
        "model": base.spec.name,
        "base_format": plan.quant if plan else None,
        "perplexity": base_ppl,
        "tokens": tokens,
        "formats": rows,
        "skipped": skipped,
    }


def format_report(report: dict[str, Any]) -> str:
    """The text form: the base, then one line per format, then what was left out and why."""
    lines = [
        f"{report['model']} as {report['base_format']}: perplexity {report['perplexity']:.4f} over "
        f"{report['tokens']} tokens"
    ]
    for row in report["formats"]:
        kl = f"{row['kl_mean']:.6f}" if row["kl_mean"] is not None else "n/a"
        lines.append(
            f"  {row['format']:<12} perplexity {row['perplexity']:.4f}  {row['ppl_increase_pct']:+.3f} %  mean KL {kl} "
            "nats (recorded for the planner)"
        )
    if not report["formats"]:
        lines.append("  no other format the planner offers for this model (nothing recorded)")
    lines += [f"  {fmt}: not measured: {why}" for fmt, why in report["skipped"].items()]
    return "\n".join(lines)
