"""A seed is any 64-bit integer, signed or unsigned (OpenAI's API takes them); anything else is a clear 400
before the request reaches a backend, never a 500 from inside an engine step (issue 16, item 2)."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeBackend

pytestmark = pytest.mark.server


@pytest.mark.parametrize(
    "seed, status", [(2**64 - 1, 200), (-(2**63), 200), (-1, 200), (2**64, 400), (-(2**63) - 1, 400), (10**30, 400)]
)
def test_seed_range_at_the_http_edge(live, seed: int, status: int) -> None:
    backend = FakeBackend()
    backend.load()
    s = live(backend)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "seed": seed, "max_tokens": 4}
    r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    if status == 400:
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "seed must be a 64-bit integer" in err["message"]
        assert str(seed) in err["message"]
