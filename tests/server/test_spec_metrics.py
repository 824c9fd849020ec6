"""/metrics carries speculative decoding's counters from the backend's EngineStats snapshot."""

from __future__ import annotations

from app.server.metrics import ServerMetrics
from backends.api import EngineStats


def test_metrics_report_proposals_acceptances_and_the_rate() -> None:
    text = ServerMetrics().render(EngineStats(spec_proposed_tokens=40, spec_accepted_tokens=30)).decode()
    assert "hearth_spec_proposed_tokens 40.0" in text
    assert "hearth_spec_accepted_tokens 30.0" in text
    assert "hearth_spec_acceptance_rate 0.75" in text
    assert "hearth_spec_acceptance_rate 0.0" in ServerMetrics().render(EngineStats()).decode()
