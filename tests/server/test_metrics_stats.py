"""/metrics renders its KV gauges from the backend's published EngineStats snapshot (Backend.stats())."""

from __future__ import annotations

import pytest

from app.server.metrics import ServerMetrics
from backends.api import EngineStats

pytestmark = pytest.mark.server


def _gauge(text: str, name: str) -> float:
    return float(text.split(f"\n{name} ")[1].split()[0])


def test_kv_gauges_come_from_the_snapshot() -> None:
    m = ServerMetrics()
    text = m.render(EngineStats(kv_blocks=10, kv_blocks_free=4, kv_block_size=16)).decode()
    assert _gauge(text, "hearth_kv_blocks_used") == 6 and _gauge(text, "hearth_kv_blocks_free") == 4
    # a backend without a paged pool (llama.cpp: kv_blocks 0) leaves them as they were
    text = m.render(EngineStats()).decode()
    assert _gauge(text, "hearth_kv_blocks_used") == 6 and _gauge(text, "hearth_kv_blocks_free") == 4
    assert _gauge(ServerMetrics().render(EngineStats()).decode(), "hearth_kv_blocks_used") == 0
