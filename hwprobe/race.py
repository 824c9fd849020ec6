"""The speed race: of the engines and formats that fit, the fastest within the quality budget.

Every candidate gets its expected speed from the measured efficiencies (hwprobe.decode_speed, through
placement.expected_tokens_per_s) and its quality cost from measured or documented perplexity increases
(hwprobe.quality.format_quality).  The command decides what "fastest" means: one stream for `hearth run` and
the chat app, all of `--max-concurrency` streams together for `hearth serve` (llama-cpp-python answers one
request at a time; the torch engine batches them, gaining what decode_speed measured at 16 streams).

The budget (Prefs.max_ppl_increase_pct, `--max-ppl-increase`) keeps the candidates within that many % of the
model's best format; where none of those fits, the best quality that fits is taken and the plan says so.  Ties
go to the better quality, then to the candidate listed first (the planner lists the torch engine first: it
batches).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hwprobe.bandwidth import CPU_BANDWIDTH_EFFICIENCY
from hwprobe.decode_speed import TORCH_CPU_BATCH16, Efficiency, aggregate_gain
from hwprobe.placement import Candidate, decode_efficiency, expected_tokens_per_s, price
from hwprobe.plan_types import DeviceMemory, PlanCandidate, Prefs
from hwprobe.quality import QualityLoss, format_quality
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape


@dataclass(frozen=True)
class Entry:
    """A candidate with its speed and quality figures."""

    candidate: Candidate
    summary: PlanCandidate

    @property
    def tokens_per_s(self) -> float:
        return self.summary.expected_tokens_per_s

    @property
    def aggregate(self) -> float:
        return self.summary.expected_aggregate_tokens_per_s


def streams(prefs: Prefs, serving: bool) -> int:
    """How many requests the command runs at once: `hearth serve` its --max-concurrency, the others one."""
    return prefs.max_num_seqs if serving else 1


def quality(shape: ModelShape, c: Candidate, prefs: Prefs) -> QualityLoss:
    records = {fmt: (pct, source) for fmt, pct, source in prefs.quality_records}
    return format_quality(c.quant, c.backend, shape.quant, records)


def entry(
    report: HardwareReport,
    shape: ModelShape,
    c: Candidate,
    prefs: Prefs,
    serving: bool,
    devices: tuple[DeviceMemory, ...] | None = None,
) -> Entry:
    """c with its speed and quality figures; `devices`: c's pricing when the caller has it already."""
    devices = devices if devices is not None else price(report, shape, c)
    tps = expected_tokens_per_s(report, shape, c, devices)
    gpu = next((g for g in report.gpus if c.gpus and g.index == c.gpus[0]), None)
    if gpu is not None and c.n_gpu_layers:
        eff = decode_efficiency(shape, c, gpu)
        share, source, gain = eff.share, eff.source, aggregate_gain(eff, streams(prefs, serving))
    else:
        share = CPU_BANDWIDTH_EFFICIENCY
        source = f"assumed: {CPU_BANDWIDTH_EFFICIENCY:.0%} of the RAM bandwidth"
        gain = aggregate_gain(Efficiency(share, TORCH_CPU_BATCH16, source), streams(prefs, serving))
    if c.backend != "torch":  # llama-cpp-python answers one request at a time
        gain = 1.0
    q = quality(shape, c, prefs)
    summary = PlanCandidate(
        backend=c.backend,
        quant=c.quant,
        gpus=c.gpus,
        ctx=c.ctx,
        kv_cache_type=c.kv_cache_type,
        expected_tokens_per_s=tps,
        expected_aggregate_tokens_per_s=round(tps * gain, 1),
        efficiency=round(share, 3),
        efficiency_source=source,
        ppl_increase_pct=q.pct,
        quality_source=q.source,
        within_budget=q.pct <= prefs.max_ppl_increase_pct + 1e-9,
    )
    return Entry(c, summary)


def winner(entries: list[Entry], serving: bool, target_ctx: int) -> Entry:
    """The fastest entry within the budget (else of the best quality that fits) that reaches the target context
    if any does; by the aggregate when serving, one stream otherwise; ties to the better quality, then the
    earlier entry."""
    pool = [e for e in entries if e.summary.within_budget]
    if not pool:
        best = min(e.summary.ppl_increase_pct for e in entries)
        pool = [e for e in entries if e.summary.ppl_increase_pct <= best + 1e-9]
    full = [e for e in pool if e.candidate.ctx >= target_ctx]
    pool = full or pool
    order = {id(e): i for i, e in enumerate(entries)}
    return min(
        pool,
        key=lambda e: (
            -(e.aggregate if serving else e.tokens_per_s),
            e.summary.ppl_increase_pct,
            order[id(e)],
        ),
    )


def summaries(entries: list[Entry], chosen: Entry) -> tuple[PlanCandidate, ...]:
    """Every entry's summary, the chosen one marked, fastest first."""
    out = [dataclasses.replace(e.summary, chosen=e is chosen) for e in entries]
    return tuple(sorted(out, key=lambda s: (not s.chosen, -s.expected_aggregate_tokens_per_s)))


def race_reason(entries: list[Entry], chosen: Entry, serving: bool, budget: float) -> str:
    """The two best candidates side by side, with the figures' sources, for the plan's reasons."""
    key = (lambda e: e.aggregate) if serving else (lambda e: e.tokens_per_s)
    unit = "tokens/s in all" if serving else "tokens/s"
    # the runner-up from the same pool (within the budget where the chosen one is), then the rest
    others = sorted(
        (e for e in entries if e is not chosen),
        key=lambda e: (e.summary.within_budget == chosen.summary.within_budget, key(e)),
        reverse=True,
    )

    def say(e: Entry) -> str:  # the sources in short: `hearth plan --json` has them whole
        s = e.summary
        speed_from = s.efficiency_source.partition(":")[0]
        quality_from = s.quality_source.partition(":")[0]
        return (
            f"{s.backend} {s.quant} ~{key(e):.0f} {unit} ({100 * s.efficiency:.0f} % of bandwidth, {speed_from}), "
            f"+{s.ppl_increase_pct:g} % perplexity ({quality_from})"
        )

    what = "the fastest" + (" for serving" if serving else " for one stream")
    if not chosen.summary.within_budget:
        what = f"nothing within the quality budget of +{budget:g} % perplexity fits, so the best quality that fits"
    else:
        what += f" within +{budget:g} % perplexity (--max-ppl-increase)"
    out = f"engine race: {say(chosen)}, {what}"
    if others:
        out += f"; next: {say(others[0])}"
    return out
