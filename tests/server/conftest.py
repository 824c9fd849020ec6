"""Live servers on 127.0.0.1 for the server tests: a FakeBackend app in a uvicorn thread."""

from __future__ import annotations

import socket
import threading
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, backend, **config) -> None:
        import uvicorn

        from app.server.app import ServerConfig, create_app
        from app.server.runner import Limits

        limits = Limits(**config.pop("limits", {}))
        self.backend = backend
        name = config.pop("model_name", "fake-model")
        self.app = create_app(backend, ServerConfig(model_name=name, limits=limits, **config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


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
