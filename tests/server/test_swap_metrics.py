"""/metrics splits preemptions by the way a request comes back, and counts the KV blocks swapped."""

from __future__ import annotations

from app.server.metrics import ServerMetrics
from backends.api import EngineStats


def test_metrics_report_preemptions_by_mode_and_swapped_blocks() -> None:
    stats = EngineStats(preemptions=5, preemptions_swapped=2, swapped_out_blocks=7, swapped_in_blocks=3)
    text = ServerMetrics().render(stats).decode()
    assert 'hearth_preemptions{mode="recompute"} 3.0' in text
    assert 'hearth_preemptions{mode="swap"} 2.0' in text
    assert "hearth_kv_swapped_out_blocks 7.0" in text
    assert "hearth_kv_swapped_in_blocks 3.0" in text
    idle = ServerMetrics().render(EngineStats()).decode()
    assert 'hearth_preemptions{mode="swap"} 0.0' in idle and 'hearth_preemptions{mode="recompute"} 0.0' in idle
