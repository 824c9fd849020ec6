"""Prometheus metrics of one server (own CollectorRegistry, so several apps in one process never clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from backends.api import EngineStats

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.5)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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
        self.running = Gauge("hearth_requests_running", "generations running now", registry=r)
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

    def render(self, stats: EngineStats) -> bytes:
        """Prometheus text; KV gauges come from the backend's published snapshot (Backend.stats()): the torch
        engine has a paged KV pool; llama.cpp reports none (kv_blocks 0), and the gauges then stay at 0."""
        if stats.kv_blocks > 0:
            self.kv_used.set(stats.kv_blocks - stats.kv_blocks_free)
            self.kv_free.set(stats.kv_blocks_free)
        self.spec_proposed.set(stats.spec_proposed_tokens)
        self.spec_accepted.set(stats.spec_accepted_tokens)
        rate = stats.spec_accepted_tokens / stats.spec_proposed_tokens if stats.spec_proposed_tokens else 0.0
        self.spec_rate.set(rate)
        return generate_latest(self.registry)
