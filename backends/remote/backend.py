"""RemoteBackend: the Backend contract over an OpenAI-compatible HTTP API.

A chat Request's messages (app/requests.py puts them there) go to POST /v1/chat/completions with
`stream: true` and `stream_options: {include_usage: true}`; a raw Request (no messages) goes to /v1/completions.
The server applies the model's chat template.  Events: STARTED once the server answered 200, TOKEN per content
delta (token ids are not sent by OpenAI servers: `token_ids` stays empty), FINISHED with the server's
finish_reason and stats from its usage chunk and hearth's own clock.  `abort()` closes the HTTP stream, which
servers take as a cancel (vLLM, llama.cpp and hearth's server abort the request when the client goes away).

Errors are hearth's: a refused key (401/403) is a ConfigError naming where the key came from; an unreachable
URL is a BackendUnavailableError naming it; a 400 about the context length is a ContextOverflowError, any other
4xx an InvalidRequestError (all exit 2, raised before STARTED); a 5xx or a stream cut short ends the stream with
FinishReason.ERROR.  Sampling sends OpenAI's own fields (temperature, top_p, max_tokens, seed, stop) and
ignore_eos when asked; top_k, min_p and repeat_penalty are the server's own business (OpenAI has no such fields
and some servers refuse unknown ones).  Tools pass through: the request's `tools` / `tool_choice` and the
messages' tool calls and results go as OpenAI sends them, and the server's `delta.tool_calls` come back written
into the text in the Hermes format (tool_text.py), which hearth's tool parser reads like a local model's.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from backends.api import (
    Backend,
    ChatMessage,
    Constraint,
    Description,
    EventKind,
    FinishReason,
    GenerationEvent,
    LoadOptions,
    ProgressCallback,
    Request,
    RequestStats,
)
from backends.engine_capabilities import REMOTE
from backends.errors import BackendUnavailableError, ContextOverflowError, InvalidRequestError
from backends.modelspec import ModelSpec
from backends.remote.spec import RemoteTarget, api_base, remote_spec
from backends.remote.tool_text import ToolCallText
from hwprobe.errors import ConfigError

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
_CONTEXT_WORDS = (
    "context length",
    "context_length",
    "maximum context",
    "context window",
    "exceed_context",
    "too many tokens",
    "exceeds the context",
)


class RemoteBackend(Backend):
    name = "remote"
    # constraints: response_format is passed through to the server, which enforces it (no literal prefix/suffix)
    capabilities = REMOTE

    def __init__(
        self,
        spec: ModelSpec,
        options: LoadOptions | None = None,
        target: RemoteTarget | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`transport`: httpx's, for tests that play a server's answers (httpx.MockTransport); None = HTTP."""
        super().__init__(spec, options)
        self._transport = transport
        if target is None:
            raise ConfigError("the remote backend needs a URL", "pass --url URL or set [remote] url in settings.toml")
        self.target = target
        self.base = api_base(target.url)
        self._client: httpx.Client | None = None
        self._open: dict[str, httpx.Response | None] = {}  # request id -> its HTTP response while streaming
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()  # streams from several threads may find the backend not yet loaded
        self._n_ctx = spec.context_length

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self, progress: ProgressCallback | None = None) -> None:
        """Ask /v1/models: it checks the URL and the key, and names the model when none was given."""
        with self._load_lock:
            if self._client is None:
                self._load(progress)

    def _load(self, progress: ProgressCallback | None) -> None:
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else {}
        timeout = httpx.Timeout(self.target.read_timeout_s, connect=self.target.connect_timeout_s)
        client = httpx.Client(headers=headers, timeout=timeout, transport=self._transport)
        if progress:
            progress(0.1, f"asking {self.base}/models")
        try:
            response = self._call(client, "GET", "/models")
            cards = [c for c in response.json().get("data", []) if isinstance(c, dict) and c.get("id")]
        except _ServerError as exc:
            client.close()
            raise BackendUnavailableError(str(exc), "check the server's log") from None
        except (ValueError, AttributeError):
            client.close()
            raise BackendUnavailableError(
                f"{self.base}/models did not answer with an OpenAI model list",
                "is --url an OpenAI-compatible server (its base, e.g. http://host:8000)?",
            ) from None
        except BaseException:
            client.close()
            raise
        ids = [str(c["id"]) for c in cards]
        name = self.target.model or (ids[0] if ids else None)
        if name is None:
            client.close()
            raise ConfigError(f"the server at {self.base} lists no models", "name one with --remote-model NAME")
        if self.target.model and ids and name not in ids:
            client.close()
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            raise ConfigError(
                f"the server at {self.base} does not serve {name!r}; it serves {shown}",
                "name one of those with --remote-model, or leave it out to take the first",
            )
        card = next((c for c in cards if c["id"] == name), {})
        self._n_ctx = _context_of(card) or self.spec.context_length
        self.spec = remote_spec(name, self.target.url, self._n_ctx)
        self._client = client
        if progress:
            progress(1.0, f"{name} at {self.base}")

    def close(self) -> None:
        with self._lock:
            ids = list(self._open)
        for rid in ids:
            self.abort(rid)
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- generation --------------------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        self.refuse_unsupported(request)
        if self._client is None:
            self.load()
        assert self._client is not None
        rid = request.request_id
        path, body = _body(self.spec.name, request)
        t0 = time.perf_counter()
        stats = RequestStats()
        with self._lock:
            self._open[rid] = None
        try:
            try:
                response = self._call(self._client, "POST", path, json=body, stream=True)
            except _ServerError as exc:
                yield GenerationEvent(EventKind.STARTED, rid, stats=stats)
                stats.total_s = time.perf_counter() - t0
                yield GenerationEvent(
                    EventKind.FINISHED, rid, finish_reason=FinishReason.ERROR, stats=stats, error=str(exc)
                )
                return
            with self._lock:
                self._open[rid] = response
            if rid in self._aborted:
                _shut(response)
            yield GenerationEvent(EventKind.STARTED, rid, stats=RequestStats())
            yield from self._events(rid, response, chat=request.messages is not None, stats=stats, t0=t0)
        finally:
            with self._lock:
                response_or_none = self._open.pop(rid, None)
                self._aborted.discard(rid)
            if response_or_none is not None:
                response_or_none.close()

    def _events(
        self, rid: str, response: httpx.Response, *, chat: bool, stats: RequestStats, t0: float
    ) -> Iterator[GenerationEvent]:
        reason: FinishReason | None = None
        error: str | None = None
        pieces = 0
        calls = ToolCallText()  # the server's delta.tool_calls, written into the text (tool_text.py)
        try:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = _message(chunk["error"]) or "the server reported an error mid-stream"
                    reason = FinishReason.ERROR
                    break
                _usage(chunk.get("usage"), stats)
                for choice in chunk.get("choices") or ():
                    text = ((choice.get("delta") or {}).get("content") if chat else choice.get("text")) or ""
                    if chat:
                        text += calls.feed((choice.get("delta") or {}).get("tool_calls"))
                        if choice.get("finish_reason"):
                            text += calls.close()
                    if text:
                        if pieces == 0:
                            stats.ttft_s = time.perf_counter() - t0
                        pieces += 1
                        yield GenerationEvent(EventKind.TOKEN, rid, text=text)
                    if choice.get("finish_reason"):
                        reason = _FINISH.get(choice["finish_reason"], FinishReason.STOP)
        except (httpx.HTTPError, json.JSONDecodeError, AttributeError, TypeError) as exc:
            if rid not in self._aborted:
                reason, error = FinishReason.ERROR, f"the stream from {self.base} broke: {_one_line(exc)}"
        if rid in self._aborted:
            reason, error = FinishReason.ABORT, None
        elif reason is None:
            reason, error = FinishReason.ERROR, f"the stream from {self.base} ended without a finish reason"
        if not stats.completion_tokens:
            stats.completion_tokens = pieces  # no usage chunk: count the deltas (one token each on most servers)
        stats.total_s = time.perf_counter() - t0
        yield GenerationEvent(EventKind.FINISHED, rid, finish_reason=reason, stats=stats, error=error)

    def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._open:
                return
            self._aborted.add(request_id)
            response = self._open[request_id]
        if response is not None:
            _shut(response)

    # -- HTTP --------------------------------------------------------------------------------------------
    def _call(
        self, client: httpx.Client, method: str, path: str, *, json: Any = None, stream: bool = False
    ) -> httpx.Response:
        url = self.base + path
        try:
            request = client.build_request(method, url, json=json)
            response = client.send(request, stream=stream)
        except httpx.TimeoutException:
            raise BackendUnavailableError(
                f"the server at {self.base} did not answer in time", "check --url and that the server is up"
            ) from None
        except httpx.HTTPError as exc:  # refused, DNS, TLS, a malformed URL
            raise BackendUnavailableError(
                f"cannot reach {self.base}: {_one_line(exc)}", "check --url and that the server is up"
            ) from None
        if response.status_code < 400:
            return response
        if stream:
            response.read()
        response.close()
        raise _http_error(response, self.base, path, self.target.key_source)

    # -- what a remote model cannot do -------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raise BackendUnavailableError(
            "the remote backend has no tokenizer: OpenAI-compatible servers do not expose one",
            "use a local model for token-level work",
        )

    def detokenize(self, token_ids: Sequence[int]) -> str:
        raise BackendUnavailableError(
            "the remote backend has no tokenizer: OpenAI-compatible servers do not expose one",
            "use a local model for token-level work",
        )

    @property
    def n_ctx(self) -> int:
        return self._n_ctx  # 0 when the server does not say

    def describe(self) -> Description:
        # n_ctx None when the server did not say: none shown
        return Description(self.name, self.spec.name, self._n_ctx or None, {"url": self.base})

    def memory_in_use(self) -> dict[str, int]:
        return {"rss_bytes": 0, "gpu_bytes": 0}  # the model's memory is the server's


class _ServerError(Exception):
    """A 5xx: the server failed this request (it ends the stream with FinishReason.ERROR)."""


def _body(model: str, request: Request) -> tuple[str, dict[str, Any]]:
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.ignore_eos:
        body["ignore_eos"] = True
    if request.constraint is not None:
        body["response_format"] = _response_format(request.constraint)
    # OpenAI's own fields, forwarded as given (never dropped: the contract honours or refuses)
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in s.logit_bias}
    if request.messages is not None:
        body["messages"] = [_message_body(m) for m in request.messages]
        if request.tools is not None:
            body["tools"] = json.loads(request.tools)
        if request.tool_choice is not None:
            body["tool_choice"] = json.loads(request.tool_choice)
        return "/chat/completions", body
    if request.prompt is None:
        raise InvalidRequestError("the remote backend takes text, not token ids", "send a text prompt")
    body["prompt"] = request.prompt
    return "/completions", body


def _message_body(m: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI takes it, tool calls and results included."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _response_format(constraint: Constraint) -> dict[str, Any]:
    """OpenAI's response_format for a constraint; literal text around the JSON (forced tool calls) has no
    response_format, so such a constraint is refused rather than dropped."""
    if constraint.prefix or constraint.suffix:
        raise InvalidRequestError(
            "the remote backend passes response_format to its server, which cannot add literal text around the JSON",
            "use a local backend for this request",
        )
    if constraint.kind == "json_object":
        return {"type": "json_object"}
    assert constraint.schema is not None
    return {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": json.loads(constraint.schema), "strict": True},
    }


def _usage(usage: Any, stats: RequestStats) -> None:
    if not isinstance(usage, dict):
        return
    stats.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    stats.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        stats.cached_tokens = int(details.get("cached_tokens") or 0)


def _context_of(card: dict[str, Any]) -> int:
    """The context length a model card states: vLLM's max_model_len, llama.cpp's meta.n_ctx_train, others."""
    meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
    for value in (card.get("max_model_len"), card.get("context_length"), meta.get("n_ctx"), meta.get("n_ctx_train")):
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _message(error: Any) -> str:
    if isinstance(error, dict):
        error = error.get("message") or error.get("error") or ""
    return str(error).splitlines()[0] if error else ""


def _http_error(response: httpx.Response, base: str, path: str, key_source: str) -> Exception:
    status = response.status_code
    code = ""
    try:
        body = response.json()
        error = body.get("error") or body.get("detail") or ""
        detail = _message(error)
        code = str(error.get("code") or "") if isinstance(error, dict) else ""
    except (ValueError, AttributeError):
        detail = response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
    said = f": {detail}" if detail else ""
    if status in (401, 403):
        return ConfigError(
            f"the server at {base} refused the API key ({status}, key from {key_source}){said}",
            "set HEARTH_REMOTE_API_KEY, or api_key under [remote] in settings.toml",
        )
    if status == 404 and path == "/models":
        return BackendUnavailableError(
            f"{base}/models is not there (404): not an OpenAI-compatible API",
            "pass the server's base URL, e.g. http://host:8000 or http://host:8000/v1",
        )
    if status >= 500:
        return _ServerError(f"the server at {base} failed ({status}){said}")
    if code == "context_length_exceeded" or any(word in detail.lower() for word in _CONTEXT_WORDS):
        return ContextOverflowError(
            f"the server at {base} refused the prompt ({status}){said}",
            "shorten the conversation (/clear in the chat) or ask for fewer --max-tokens",
        )
    if status == 404:
        return ConfigError(
            f"the server at {base} does not serve that model (404){said}",
            "name one it lists at /v1/models with --remote-model NAME",
        )
    return InvalidRequestError(f"the server at {base} refused the request ({status}){said}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _shut(response: httpx.Response) -> None:
    """End a stream another thread is reading: closing the response from here would not wake a read blocked
    on the socket, so shut the socket down; the reader's read then returns, it ends the stream with ABORT and
    closes the response, and the server sees its client go (and aborts the request)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        response.close()  # no socket to reach (another transport): the best that can be done from here
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: the stream has ended by itself
