"""The tiny float32 Llama on a KV pool of six blocks, shared by the lossless-preemption tests (recompute and swap):
four streams of 40 tokens keep pushing each other out of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.api import LoadOptions
from tests.gguf_factory import write_tiny_llama

BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # K and V x 2 layers x 2 KV heads x head dim 16 x float32 x 16 tokens


def open_tight_backend(folder: Path, build: Any = None) -> Any:
    """A loaded TorchBackend on the tiny model with a 6-block pool; `build` as TorchBackend's build hook."""
    from backends.modelspec import load_spec
    from backends.torch_engine.backend import TorchBackend

    path = write_tiny_llama(folder / "tiny.gguf", context_length=256, seed=3)
    options = LoadOptions(
        n_ctx=96, max_num_seqs=4, n_batch=32, dtype="float32", device="cpu", kv_cache_bytes=6 * BLOCK_BYTES
    )
    b = TorchBackend(load_spec(path), options, **({"build": build} if build is not None else {}))
    b.load()
    return b
