"""What `hearth bench` sends and how (app/bench.py's worker times it).

The prompts: fixed-seed token ids of exact length, or text of common words (a remote model, --chat).  The paths
one request takes: in process with token ids, as one user message through the model's chat template (--chat, or
a remote model), or over HTTP through hearth's OpenAI server (--http: /v1/completions with token ids,
/v1/chat/completions with --chat).  Each path is a function of (prompt, seed, priority) returning one request's
figures (`Sample`).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.requests import chat_request
from backends.api import Request, SamplingParams

if TYPE_CHECKING:
    from app.bench import Workload


def synthetic_prompts(vocab: int, specials: set[int], n: int, length: int, seed: int) -> list[tuple[int, ...]]:
    """`n` deterministic prompts of exactly `length` ids, drawn from the vocabulary minus special tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids: list[int] = []
        while len(ids) < length:
            t = rng.randrange(vocab)
            if t not in specials:
                ids.append(t)
        out.append(tuple(ids))
    return out


_WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "it",
    "his",
    "her",
    "they",
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "number",
    "night",
    "point",
    "home",
)


def synthetic_texts(n: int, length: int, seed: int) -> list[str]:
    """`n` deterministic prompts of `length` common English words (about one token each): a remote model's
    tokenizer is the server's, so its prompts are text, not ids, and their token counts are about `length`."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(length)) for _ in range(n)]


@dataclass
class Sample:
    """One request's figures, from either path."""

    tokens: int
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    error: str | None = None


def send_in_process(backend: Any, w: Workload) -> Callable[[tuple[int, ...], int, int], Sample]:
    """Token-id prompts straight to the backend (no template, no server)."""

    def one(prompt: tuple[int, ...], seed: int, priority: int) -> Sample:
        params = SamplingParams(temperature=w.temperature, max_tokens=w.gen_tokens, ignore_eos=True, seed=seed)
        c = backend.generate(Request(prompt_token_ids=prompt, sampling=params, priority=priority))
        return Sample(
            len(c.token_ids), c.stats.ttft_s, c.stats.prefill_tokens_per_s, c.stats.decode_tokens_per_s, c.error
        )

    return one


def send_chat(backend: Any, w: Workload, *, remote: bool) -> Callable[[str, int, int], Sample]:
    """Each prompt is one user message through the one request builder (the model's chat template, as the
    server does for /v1/chat/completions): --chat on a local model, or a remote model (--backend remote), whose
    generated tokens are the server's count (its usage chunk, else the streamed deltas)."""

    def one(prompt: str, seed: int, priority: int) -> Sample:
        params = SamplingParams(temperature=w.temperature, max_tokens=w.gen_tokens, ignore_eos=True, seed=seed)
        messages = [{"role": "user", "content": prompt}]
        c = backend.generate(chat_request(backend.spec, messages, params, priority=priority).request)
        return Sample(
            c.stats.completion_tokens if remote else len(c.token_ids),
            c.stats.ttft_s,
            c.stats.prefill_tokens_per_s,
            c.stats.decode_tokens_per_s,
            c.error,
        )

    return one


def send_over_http_chat(url: str, w: Workload) -> Callable[[str, int, int], Sample]:
    """--chat over HTTP: a streaming POST /v1/chat/completions with one user message (what chat clients send)."""
    client = _thread_client(url)

    def one(prompt: str, seed: int, priority: int) -> Sample:
        body = {**_stream_body(w, seed, priority), "messages": [{"role": "user", "content": prompt}]}
        return read_sse(
            client(), "/v1/chat/completions", body, lambda c: (c["choices"][0].get("delta") or {}).get("content")
        )

    return one


def _thread_client(url: str) -> Callable[[], Any]:
    """An httpx client per calling thread (a client is not shared between threads), made on first use."""
    import httpx  # lazy: heavy: httpx

    local = threading.local()

    def client() -> Any:
        made = getattr(local, "client", None)
        if made is None:
            made = local.client = httpx.Client(base_url=url, timeout=600)
        return made

    return client


def _stream_body(w: Workload, seed: int, priority: int) -> dict[str, Any]:
    """What both HTTP paths send besides the prompt: a streamed, seeded, fixed-length request with usage."""
    return {
        "model": "bench",
        "priority": priority,
        "max_tokens": w.gen_tokens,
        "temperature": w.temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def read_sse(client: Any, path: str, body: dict[str, Any], text_of: Callable[[dict], Any]) -> Sample:
    """POST `body` to `path`, read the SSE stream: time to the first text, the decode rate, the usage count."""
    t0 = time.perf_counter()
    first = last = None
    tokens = prompt_tokens = 0
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return Sample(0, 0.0, 0.0, 0.0, f"HTTP {r.status_code}: {r.read().decode()[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and text_of(chunk):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    if first is None or last is None:
        return Sample(tokens, 0.0, 0.0, 0.0, "the stream carried no text")
    ttft = first - t0
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return Sample(tokens, ttft, prompt_tokens / ttft if ttft > 0 else 0.0, decode)


def send_over_http(url: str, w: Workload) -> Callable[[tuple[int, ...], int, int], Sample]:
    """The same request as a streaming POST /v1/completions with token ids (what an OpenAI client sends)."""
    client = _thread_client(url)

    def one(prompt: tuple[int, ...], seed: int, priority: int) -> Sample:
        body = {**_stream_body(w, seed, priority), "prompt": list(prompt)}
        return read_sse(client(), "/v1/completions", body, lambda c: c["choices"][0].get("text"))

    return one
