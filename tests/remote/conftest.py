"""hearth's own server on 127.0.0.1 (a FakeBackend behind it) for the remote backend to talk to."""

from __future__ import annotations

import pytest

from app.server.background import BackgroundServer


@pytest.fixture
def served():
    servers = []

    def start(backend, model_name: str = "fake-model", **config) -> BackgroundServer:
        server = BackgroundServer(backend, model_name, **config)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
