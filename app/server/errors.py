"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class APIError(Exception):
    """An error a client sees; raised anywhere in a route and turned into a JSON body by the app."""

    status: int  # HTTP status
    message: str  # one line for the client, with the numbers
    type: str = "invalid_request_error"  # OpenAI error type
    param: str | None = None  # the request field at fault, when there is one
    code: str | None = None  # machine-readable code ("model_not_found", "context_length_exceeded", ...)
    headers: dict[str, str] | None = None  # e.g. Retry-After on 429

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()
