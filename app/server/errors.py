"""The server's errors: OpenAI-style bodies ({"error": {"message", "type", "param", "code"}} with a 4xx/5xx
status), the one mapping from engine errors to them, and the last resort for everything else.

Every failure a client sees is JSON in its API's own shape (Ollama's `{"error": ...}` under /api/, chosen where
the response is written).  An exception nobody planned for becomes a 500 whose message carries an id
("error id err-...") that the server's log repeats beside the traceback, so a user's bug report and the log
meet (`internal_error`).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from backends.errors import (
    ConstraintError,
    ContextOverflowError,
    HearthError,
    InvalidRequestError,
    OutOfMemoryError,
    RunnerCrashedError,
)

log = logging.getLogger("hearth.server")


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


def internal_error(exc: BaseException, where: str) -> APIError:
    """A 500 for an exception no handler expected: logged with its traceback under a fresh id, which the
    message names so the client's report can be found in the server's log."""
    error_id = f"err-{uuid.uuid4().hex[:12]}"
    log.error("error id %s: unexpected %s in %s", error_id, type(exc).__name__, where, exc_info=exc)
    return APIError(
        500,
        f"internal server error (error id {error_id}, in {where}): {type(exc).__name__}: {exc}; "
        "the server's log has the details under that id",
        type="server_error",
        code="internal_error",
    )


def engine_error(exc: BaseException, where: str, param: str | None = None) -> APIError:
    """The one mapping of what an engine call raised (a generation, tokenize, detokenize, embed, a load) to the
    error a client sees; `param` is the request field that fed the call.  A runner that crashed or is being
    restarted under the call is a 500 "runner_crashed" whatever the call was (the server stays up and the next
    request runs on the new runner); anything that is no HearthError is a bug: internal_error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return APIError(400, exc.one_line(), param=param or "messages", code="context_length_exceeded")
    if isinstance(exc, ConstraintError):  # app/server/response_format.named() says which field it came from
        return APIError(400, exc.one_line(), code="constraint_refused")
    if isinstance(exc, InvalidRequestError):
        return APIError(400, exc.one_line(), param=param)
    if isinstance(exc, RunnerCrashedError):  # the model's runner died: this request is lost, the server is not
        return APIError(500, exc.one_line(), type="server_error", code="runner_crashed")
    if isinstance(exc, OutOfMemoryError):
        return APIError(500, exc.one_line(), type="server_error", code="out_of_memory")
    if isinstance(exc, HearthError):
        return APIError(500, exc.one_line(), type="server_error")
    return internal_error(exc, where)
