"""Live servers on 127.0.0.1 for the server tests: a FakeBackend app in a uvicorn thread."""

from __future__ import annotations

import pytest

from app.server.background import BackgroundServer


class LiveServer(BackgroundServer):
    def __init__(self, backend, **config) -> None:
        super().__init__(backend, config.pop("model_name", "fake-model"), **config)


@pytest.fixture
def live():
    servers = []

    def start(backend, **config):
        s = LiveServer(backend, **config)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
