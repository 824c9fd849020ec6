"""Prometheus metrics of one server (own CollectorRegistry, so several apps in one process never clash).

Time to first token by priority (issue 27): a histogram labelled by the request's priority (for Prometheus'
histogram_quantile), the TTFT target the engine plans for, how many first tokens met it, and, for a person
reading /metrics by eye, p50/p90/p95/p99 and the share that met the target over the last WINDOW requests of
each priority (gauges computed when /metrics is read).
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from backends.api import EngineStats

WINDOW = 1000  # first tokens per priority kept for the percentile gauges
QUANTILES = (50, 90, 95, 99)

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.5)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class ServerMetrics:
    """The server's Prometheus metrics: HTTP traffic and tokens, the engine's gauges, and TTFT by priority."""

    def __init__(self, ttft_target_s: float = 0.5) -> None:
        self.registry = CollectorRegistry()
        self._add_traffic(self.registry)
        self._add_engine_gauges(self.registry)
        self._add_ttft_by_priority(self.registry, ttft_target_s)
        self._recent: dict[int, deque[float]] = {}

    def _add_traffic(self, r: CollectorRegistry) -> None:
        """Requests answered, tokens in and out, and the latency histograms of every request."""
        self.requests = Counter(
            "hearth_http_requests", "HTTP requests answered, by path and status", ("path", "status"), registry=r
        )
        self.prompt_tokens = Counter("hearth_prompt_tokens", "prompt tokens processed", registry=r)
        self.generated_tokens = Counter("hearth_generation_tokens", "tokens generated", registry=r)
        self.finished = Counter("hearth_requests_finished", "generations finished, by reason", ("reason",), registry=r)
        self.ttft = Histogram(
            "hearth_time_to_first_token_seconds", "request arrival -> first token", buckets=_TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "hearth_time_per_output_token_seconds",
            "time between tokens of one stream",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )

    def _add_engine_gauges(self, r: CollectorRegistry) -> None:
        """Generations running and queued (the runner sets them), and the engine's gauges render() sets from
        the backend's snapshot: KV blocks, speculative decoding, preemptions and swaps, TTFT-plan deferrals."""
        self.running = Gauge("hearth_requests_running", "generations running now", registry=r)
        self.models_loaded = Gauge(
            "hearth_models_loaded", "models loaded now (hearth serve loads on demand)", registry=r
        )
        self.model_loaded = Gauge(
            "hearth_model_loaded", "1 for each model loaded now, with its name", ["model"], registry=r
        )
        self.queued = Gauge("hearth_queue_depth", "generations waiting for a slot", registry=r)
        self.kv_used = Gauge("hearth_kv_blocks_used", "KV cache blocks in use (backends that report them)", registry=r)
        self.kv_free = Gauge("hearth_kv_blocks_free", "KV cache blocks free (backends that report them)", registry=r)
        # speculative decoding (torch engine, --speculative): totals since load, from the backend's snapshot
        self.spec_proposed = Gauge(
            "hearth_spec_proposed_tokens", "speculative tokens proposed and verified since load", registry=r
        )
        self.spec_accepted = Gauge(
            "hearth_spec_accepted_tokens", "speculative tokens the target model accepted since load", registry=r
        )
        self.spec_rate = Gauge(
            "hearth_spec_acceptance_rate", "accepted / proposed speculative tokens since load (0 when none)", registry=r
        )
        # by the way the request comes back: "recompute" (its tokens prefilled again) or "swap" (its KV blocks
        # copied to host RAM and back; a GPU engine with swap space); the sum is every preemption
        self.preemptions = Gauge(
            "hearth_preemptions", "requests preempted since load (torch engine), by mode", ("mode",), registry=r
        )
        self.swapped_out = Gauge(
            "hearth_kv_swapped_out_blocks", "KV blocks swapped out to host RAM since load", registry=r
        )
        self.swapped_in = Gauge("hearth_kv_swapped_in_blocks", "KV blocks swapped back in since load", registry=r)
        self.deferred = Gauge(
            "hearth_ttft_deferred", "running requests held back a step by the TTFT plan since load", registry=r
        )

    def _add_ttft_by_priority(self, r: CollectorRegistry, ttft_target_s: float) -> None:
        """TTFT by priority (issue 27): the target the engine plans for, a histogram and the target-met counter by
        priority, and the gauges over the recent window."""
        self.ttft_target_s = ttft_target_s  # 0 = the engine plans for none; the share is then not reported
        Gauge("hearth_ttft_target_seconds", "the TTFT target the engine plans for (0 = none)", registry=r).set(
            ttft_target_s
        )
        self.ttft_by_priority = Histogram(
            "hearth_ttft_by_priority_seconds",
            "request arrival -> first token, by request priority",
            ("priority",),
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.ttft_met = Counter(
            "hearth_ttft_target_met",
            "first tokens that came within the TTFT target, by priority",
            ("priority",),
            registry=r,
        )
        self.ttft_quantile = Gauge(
            "hearth_ttft_recent_seconds",
            f"TTFT percentiles over the last {WINDOW} requests of each priority",
            ("priority", "quantile"),
            registry=r,
        )
        self.ttft_met_share = Gauge(
            "hearth_ttft_target_met_ratio",
            f"share of the last {WINDOW} requests of each priority whose first token met the target",
            ("priority",),
            registry=r,
        )

    def observe_ttft(self, priority: int, seconds: float) -> None:
        label = str(priority)
        self.ttft.observe(seconds)
        self.ttft_by_priority.labels(label).observe(seconds)
        if self.ttft_target_s > 0 and seconds <= self.ttft_target_s:
            self.ttft_met.labels(label).inc()
        self._recent.setdefault(priority, deque(maxlen=WINDOW)).append(seconds)

    def ttft_summary(self) -> dict[int, dict[str, float]]:
        """{priority: {"n", "p50", "p90", "p95", "p99", "met"}} over the recent window (seconds; met: 0..1)."""
        out: dict[int, dict[str, float]] = {}
        for priority, window in sorted(self._recent.items()):
            values = list(window)
            row: dict[str, float] = {"n": len(values)}
            row.update({f"p{q}": percentile(values, q) for q in QUANTILES})
            if self.ttft_target_s > 0:
                row["met"] = sum(v <= self.ttft_target_s for v in values) / len(values)
            out[priority] = row
        return out

    def render(self, stats: EngineStats, loaded: list[str] | None = None) -> bytes:
        """Prometheus text; KV gauges come from the backend's published snapshot (Backend.stats()): the torch
        engine has a paged KV pool; llama.cpp reports none (kv_blocks 0), and the gauges then stay at 0.
        `loaded`: the names of the models loaded now (hearth_model_loaded; None leaves them as they are)."""
        if loaded is not None:
            self.model_loaded.clear()
            for name in loaded:
                self.model_loaded.labels(name).set(1)
            self.models_loaded.set(len(loaded))
        if stats.kv_blocks > 0:
            self.kv_used.set(stats.kv_blocks - stats.kv_blocks_free)
            self.kv_free.set(stats.kv_blocks_free)
        self.spec_proposed.set(stats.spec_proposed_tokens)
        self.spec_accepted.set(stats.spec_accepted_tokens)
        rate = stats.spec_accepted_tokens / stats.spec_proposed_tokens if stats.spec_proposed_tokens else 0.0
        self.spec_rate.set(rate)
        self.preemptions.labels("recompute").set(stats.preemptions - stats.preemptions_swapped)
        self.preemptions.labels("swap").set(stats.preemptions_swapped)
        self.swapped_out.set(stats.swapped_out_blocks)
        self.swapped_in.set(stats.swapped_in_blocks)
        self.deferred.set(stats.deferred)
        for priority, row in self.ttft_summary().items():
            for q in QUANTILES:
                self.ttft_quantile.labels(str(priority), f"0.{q}").set(row[f"p{q}"])
            if "met" in row:
                self.ttft_met_share.labels(str(priority)).set(row["met"])
        return generate_latest(self.registry)
