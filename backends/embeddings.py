"""What a model's embeddings are: which models are embedding models, and how their hidden states are pooled.

Pure Python (no torch, no llama_cpp): the model store, `hearth models` / `show`, the planner's caller, the server
and both engines read these facts from a ModelSpec.

Pooling follows llama.cpp's `<arch>.pooling_type` GGUF key (enum llama_pooling_type: 0 none, 1 mean, 2 cls,
3 last, 4 rank).  A file without the key (every chat model) is pooled by the mean of its last hidden states,
as Ollama and llama.cpp's server do for a decoder model asked for an embedding.  Every embedding is
L2-normalized, as llama.cpp's `embd_normalize` default (2) and Ollama's /api/embed give them, so a dot product
is the cosine similarity.

An *embedding model* is one that only embeds: an encoder architecture (BERT and its kin: nomic-embed, bge,
jina, modern-bert, ...), or a file that names its own pooling (a decoder fine-tuned for embeddings, such as
Qwen3-Embedding, sets `pooling_type`), or one whose attention is marked non-causal.  hearth lists them as
such, plans them small (their training context, one sequence) and refuses to chat with them.
"""

from __future__ import annotations

from typing import Any

# llama_pooling_type values (llama.h) -> hearth's names
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLING_IDS = {name: i for i, name in POOLING_TYPES.items()}

# GGUF architectures llama.cpp runs as encoders (llama-arch.cpp): embedding models, never chat models
ENCODER_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert", "t5encoder"}
)


def pooling_type(spec: Any) -> str:
    """How `spec`'s hidden states become one vector: "mean" | "cls" | "last" | "rank" ("rank" is a reranker's
    score, not an embedding).  The GGUF's own `<arch>.pooling_type`; a file that says none (or nothing) is
    pooled by the mean, which is what a whole-input embedding of a decoder means in Ollama and llama.cpp."""
    value = spec.metadata.get(f"{spec.architecture}.pooling_type")
    name = POOLING_TYPES.get(value) if isinstance(value, int) and not isinstance(value, bool) else None
    return name if name not in (None, "none") else "mean"


def is_embedding_model(spec: Any) -> bool:
    """Whether `spec` is a model that only embeds (see the module docstring)."""
    if spec.architecture in ENCODER_ARCHITECTURES:
        return True
    md = spec.metadata
    value = md.get(f"{spec.architecture}.pooling_type")
    if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2, 3, 4):
        return True
    return md.get(f"{spec.architecture}.attention.causal") is False


def kind(spec: Any) -> str:
    """ "embedding" or "chat": what `hearth models` and `hearth show` print, and /api/show's capabilities."""
    return "embedding" if is_embedding_model(spec) else "chat"


def not_for_chat(spec: Any) -> str:
    """The one line that refuses a chat or completion request to an embedding model."""
    return (
        f"{spec.name} is an embedding model ({spec.architecture}, {pooling_type(spec)} pooling): it makes vectors, "
        "not text; send its inputs to /v1/embeddings or /api/embed, and chat with a chat model"
    )
