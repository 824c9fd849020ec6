"""`/v1/embeddings` (OpenAI's), and the one embedding path it shares with Ollama's /api/embed (app/server/ollama.py).

Inputs are text (tokenized with the model's special tokens added, BOS / [CLS] ... [SEP], and special tokens in the
text read as plain text, as llama.cpp's embedding and OpenAI's tokenizers do) or token ids (sent as they are).
The backend pools the last hidden states (backends/embeddings.py: the GGUF's own pooling, else the mean) and
L2-normalizes them, so both engines and both APIs give the same vectors.  `encoding_format: "base64"` is the
float32 little-endian bytes in base64, as OpenAI sends them (the openai SDK asks for it by default and decodes
it).  `dimensions` (both APIs) keeps the first d components and normalizes them again, as OpenAI's
text-embedding-3 models and Ollama do: meant for models trained to be cut that way (Matryoshka: nomic-embed,
mxbai-embed, ...), which no GGUF records, so it is the caller's choice; more than the model's size is a 400.

Work per request is bounded: at most MAX_INPUTS inputs, each within the context (else 400 naming the input).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool

from app.server.errors import APIError, engine_error
from backends.api import Backend

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 400 naming it
    model: StrictStr
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: StrictStr | None = None  # the caller's own records: changes nothing here


@dataclass
class Embedded:
    vectors: Any  # (len(inputs), hidden) float32, pooled and normalized
    token_counts: list[int]  # tokens of each input, as embedded (after truncation)


def as_inputs(value: Any, param: str) -> list[str] | list[list[int]]:
    """OpenAI's input forms as a list of texts or a list of token-id lists; APIError 400 naming `param`."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise APIError(400, f"{param} must be a string, a list of strings or token ids, and not empty", param=param)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]  # one input given as token ids
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"{param} has {len(value)} inputs; at most {MAX_INPUTS} per request", param=param)
    for i, v in enumerate(value):
        if isinstance(v, str):
            if not v:
                raise APIError(400, f"{param}[{i}] is an empty string: there is nothing to embed", param=param)
        elif not (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)):
            raise APIError(
                400, f"{param}[{i}] must be a non-empty string or a non-empty list of token ids", param=param
            )
    kinds = {isinstance(v, str) for v in value}
    if len(kinds) > 1:
        raise APIError(400, f"{param} mixes strings and token ids: send one kind", param=param)
    return value


def check_dimensions(backend: Backend, dimensions: int | None, model: str) -> None:
    """A 400 for `dimensions` above the model's embedding size (none is fewer than 1: the schemas say so)."""
    hidden = backend.spec.hidden_size
    if dimensions is not None and hidden and dimensions > hidden:
        raise APIError(
            400,
            f"dimensions={dimensions}: {model} gives {hidden}-dimensional embeddings; ask for at most {hidden}",
            param="dimensions",
        )


def cut_to(vectors: Any, dimensions: int | None) -> Any:
    """The first `dimensions` components of each row, L2-normalized again (None: the rows as they are)."""
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.where(norms > 0, norms, 1.0)).astype(vectors.dtype)


def embed_inputs(
    backend: Backend, inputs: list[str] | list[list[int]], truncate: bool, param: str, dimensions: int | None = None
) -> Embedded:
    """Tokenize (text) and embed.  `truncate`: cut each input to the context (Ollama's default) instead of a 400;
    `dimensions`: each vector cut to that many components and normalized again (cut_to).
    Blocking: call it on a worker thread.  What the engine calls raise (a runner that crashed under them, a
    refusal, a bug) is mapped once, by engine_error, as for a generation."""
    if not backend.capabilities.embeddings:
        raise APIError(400, f"the {backend.name} backend does not compute embeddings", param=param)
    try:
        batch = _token_batch(backend, inputs, truncate, param)
        vectors = backend.embed(batch)
    except Exception as exc:  # noqa: BLE001 - every kind is mapped (APIError passes as it is)
        raise engine_error(exc, "embeddings", param) from None
    return Embedded(cut_to(vectors, dimensions), [len(ids) for ids in batch])


def _token_batch(backend: Backend, inputs: list[str] | list[list[int]], truncate: bool, param: str) -> list[list[int]]:
    """Each input's token ids, checked against the vocabulary and the context (cut to it with `truncate`)."""
    n_ctx = backend.n_ctx
    vocab = backend.spec.vocab_size
    batch: list[list[int]] = []
    for i, item in enumerate(inputs):
        ids = backend.tokenize(item, add_special=True, parse_special=False) if isinstance(item, str) else list(item)
        bad = next((t for t in ids if not 0 <= t < vocab), None) if vocab > 0 else None
        if bad is not None:
            raise APIError(400, f"{param}[{i}]: token id {bad} is outside the vocabulary (0..{vocab - 1})", param=param)
        if len(ids) > n_ctx:
            if not truncate:
                raise APIError(
                    400,
                    f"{param}[{i}] is {len(ids)} tokens, more than the context of {n_ctx}: shorten it",
                    param=param,
                    code="context_length_exceeded",
                )
            ids = ids[:n_ctx]
        batch.append(ids)
    return batch


async def openai_embeddings(backend: Backend, body: EmbeddingRequest) -> dict:
    """The /v1/embeddings answer for a validated body (the model name is checked by the caller)."""
    inputs = as_inputs(body.input, "input")
    check_dimensions(backend, body.dimensions, body.model)
    done = await run_in_threadpool(embed_inputs, backend, inputs, False, "input", body.dimensions)
    data = []
    for i, row in enumerate(done.vectors):
        value: Any = (
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
            if body.encoding_format == "base64"
            else [float(x) for x in row]
        )
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(done.token_counts)
    return {
        "object": "list",
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
