"""BackgroundServer: the OpenAI-compatible app on 127.0.0.1 in a uvicorn thread of this process, for
`hearth bench --http` and the server tests (`hearth serve` runs uvicorn in the foreground instead)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from app.server.runner import Limits
from backends.api import Backend


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """Serves `backend` under `model_name` at `url` until `stop()`; config: ServerConfig fields, and limits as a
    dict of Limits fields."""

    def __init__(self, backend: Backend, model_name: str, **config: Any) -> None:
        import uvicorn  # lazy: heavy: uvicorn

        from app.server.app import ServerConfig, create_app  # lazy: heavy: fastapi, pydantic, starlette

        limits = Limits(**config.pop("limits", {}))
        self.backend = backend
        self.app = create_app(backend, ServerConfig(model_name=model_name, limits=limits, **config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=2)
        )
        self.thread = threading.Thread(target=self.server.run, name="hearth-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
