"""What Ollama's model endpoints say about a model (/api/tags, /api/show, /api/ps), from its GGUF header.

Names are hearth's registered names (`hearth models`); Ollama clients often add a tag (`name:latest`), which
names the same model.  `digest` is Ollama's model id; hearth has no manifest, so it is the sha256 of the file's
path, size and modification time: stable while the file is, not a content hash (hashing a 40 GB file on every
/api/tags would take minutes).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.embeddings import is_embedding_model
from backends.modelspec import ModelSpec

TAG = "latest"


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # hearth's registered name
    spec: ModelSpec
    size_bytes: int  # on disk, every shard
    modified_s: float  # the file's mtime (Unix seconds)


Catalog = Callable[[], list[CatalogEntry]]


def same_model(asked: str, name: str) -> bool:
    """`asked` names `name`: exactly, or with Ollama's default tag."""
    return asked == name or asked == f"{name}:{TAG}"


def entry_for(spec: ModelSpec, name: str) -> CatalogEntry:
    """An entry for a model from its spec alone (the served model when it was given as a path)."""
    try:
        modified = os.stat(spec.path).st_mtime
    except OSError:
        modified = 0.0
    return CatalogEntry(name, spec, spec.file_size_bytes, modified)


def timestamp(seconds: float) -> str:
    """RFC 3339 with nanoseconds and Z, as Ollama writes times."""
    whole = int(seconds)
    nanos = int(round((seconds - whole) * 1e9))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{min(nanos, 999_999_999):09d}Z"


def digest(entry: CatalogEntry) -> str:
    key = f"{entry.spec.path}\0{entry.size_bytes}\0{entry.modified_s}".encode()
    return hashlib.sha256(key).hexdigest()


def _parameter_size(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}".replace(".0", "")
    return str(n)


def details(spec: ModelSpec) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": spec.format,
        "family": spec.architecture,
        "families": [spec.architecture],
        "parameter_size": _parameter_size(spec.param_count),
        "quantization_level": spec.file_type,
    }


def tags_entry(entry: CatalogEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "model": entry.name,
        "modified_at": timestamp(entry.modified_s),
        "size": entry.size_bytes,
        "digest": digest(entry),
        "details": details(entry.spec),
    }


def capabilities(spec: ModelSpec) -> list[str]:
    """Ollama's capability names: "embedding" for an embedding model; else "completion", plus "tools" (hearth
    calls tools on every chat template: the model's own format or hearth's Hermes-style one) and "thinking"
    where the template has a thinking switch."""
    if is_embedding_model(spec):
        return ["embedding"]
    caps = ["completion", "tools"]
    if thinking_template(spec):
        caps.append("thinking")
    return caps


def thinking_template(spec: ModelSpec) -> bool:
    """Whether the chat template turns reasoning on and off (Qwen3's `enable_thinking`, as Ollama reads it)."""
    return bool(spec.chat_template and "enable_thinking" in spec.chat_template)


def show_body(entry: CatalogEntry, served_ctx: int | None) -> dict[str, Any]:
    spec = entry.spec
    info: dict[str, Any] = {
        "general.architecture": spec.architecture,
        "general.name": spec.name,
        "general.parameter_count": spec.param_count,
        "general.file_type": spec.file_type,
        f"{spec.architecture}.context_length": spec.context_length,
        f"{spec.architecture}.embedding_length": spec.hidden_size,
        f"{spec.architecture}.block_count": spec.n_layers,
        f"{spec.architecture}.attention.head_count": spec.n_heads,
        f"{spec.architecture}.attention.head_count_kv": spec.n_kv_heads,
        f"{spec.architecture}.feed_forward_length": spec.ffn_size,
        "tokenizer.ggml.model": spec.tokenizer_model,
    }
    for key, value in spec.metadata.items():  # the other small metadata values, as the file has them
        if isinstance(value, (str, int, float, bool)) and key not in info:
            info[key] = value
    body: dict[str, Any] = {
        "modelfile": f"# hearth serves {entry.name} from {spec.path}\nFROM {spec.path}\n",
        "parameters": "",  # no Modelfile parameters: hearth's defaults are the README's
        "template": spec.chat_template or "",
        "details": details(spec),
        "model_info": info,
        "capabilities": capabilities(spec),
        "modified_at": timestamp(entry.modified_s),
    }
    if served_ctx is not None:
        body["context_length"] = served_ctx  # what this server loaded (hearth's plan), not the training context
    return body


def ps_entry(entry: CatalogEntry, n_ctx: int, memory: dict[str, int], expires_s: float | None) -> dict[str, Any]:
    gpu = int(memory.get("gpu_bytes", 0))
    return {
        "name": entry.name,
        "model": entry.name,
        "size": int(memory.get("rss_bytes", 0)) + gpu,
        "digest": digest(entry),
        "details": details(entry.spec),
        # no expiry: "0001-01-01T00:00:00Z" is Go's zero time, which Ollama's clients read as "never"
        "expires_at": timestamp(expires_s) if expires_s is not None else "0001-01-01T00:00:00Z",
        "size_vram": gpu,
        "context_length": n_ctx,
    }
