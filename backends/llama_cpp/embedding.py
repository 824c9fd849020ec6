"""llama.cpp's embedding mode for the llama.cpp backend: a second llama_context on the already loaded weights.

Why a second context and not a second Llama(embedding=True): the weights are shared (llama_init_from_model on
the same llama_model), so an embedding costs only this context's KV cache and compute buffer, not another copy
of the model; and the chat context keeps its own KV cache (its prompt reuse survives an embedding request).
The context is made at the first embedding request, with `embeddings = true` and the pooling the model asks
for (backends/embeddings.py), and one sequence a decode: every input is evaluated whole in one ubatch (llama.cpp
pools a sequence only within one ubatch), so the context and its ubatch are the same size.

An embedding model (BERT-style encoder) has no chat context at all: the backend loads it straight into this
mode.  Every call runs on the backend's one llama.cpp thread (backends/llama_cpp/one_thread.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.embeddings import POOLING_IDS
from backends.errors import ContextOverflowError, InvalidRequestError


class EmbeddingContext:
    """A llama_context in embedding mode: `ctx` (llama_cpp._internals.LlamaContext) over `model`; `owned`: close()
    frees it (a context made by `new`), else the Llama that made it does (an embedding model's own context)."""

    def __init__(self, model: Any, ctx: Any, n_ctx: int, verbose: bool, owned: bool) -> None:
        from llama_cpp import _internals as internals  # lazy: heavy: llama_cpp

        self.n_ctx = n_ctx
        self.n_embd = model.n_embd()
        self._ctx = ctx
        self._owned = owned
        self._batch = internals.LlamaBatch(n_tokens=n_ctx, embd=0, n_seq_max=1, verbose=verbose)

    @classmethod
    def new(cls, model: Any, n_ctx: int, pooling: str, n_threads: int | None, verbose: bool) -> EmbeddingContext:
        """A second context on the loaded weights (a chat model asked for embeddings)."""
        import llama_cpp  # lazy: heavy: llama_cpp
        from llama_cpp import _internals as internals  # lazy: heavy: llama_cpp

        refuse_rank(pooling)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_ctx  # a sequence is pooled within one ubatch: it must fit whole
        params.n_seq_max = 1
        params.embeddings = True
        params.pooling_type = POOLING_IDS[pooling]
        if n_threads:
            params.n_threads = params.n_threads_batch = n_threads
        return cls(model, internals.LlamaContext(model=model, params=params, verbose=verbose), n_ctx, verbose, True)

    def embed(self, inputs: Sequence[Sequence[int]]) -> Any:
        """(len(inputs), n_embd) float32, each row pooled by llama.cpp and L2-normalized."""
        import llama_cpp  # lazy: heavy: llama_cpp
        import numpy as np  # lazy: heavy: numpy

        out = np.zeros((len(inputs), self.n_embd), dtype=np.float32)
        for i, ids in enumerate(inputs):
            if not ids:
                raise InvalidRequestError(f"input {i} is empty")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(
                    f"input {i} is {len(ids)} tokens but the embedding context is {self.n_ctx}",
                    "shorten it (Ollama's truncate: true cuts it to fit) or load a larger --ctx",
                )
            self._ctx.kv_cache_clear()
            self._batch.reset()
            self._batch.add_sequence(list(ids), 0, True)  # every token an output: llama.cpp pools their rows
            self._ctx.decode(self._batch)  # an encoder's context runs llama_encode for it (llama.cpp's own switch)
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx.ctx, 0)
            if not ptr:
                raise InvalidRequestError("llama.cpp returned no pooled embedding for this model")
            out[i] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        self._ctx.kv_cache_clear()
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)

    def close(self) -> None:
        self._batch.close()
        if self._owned:
            self._ctx.close()


def refuse_rank(pooling: str) -> None:
    if pooling == "rank":
        raise InvalidRequestError(
            "this model is a reranker (rank pooling): it scores pairs of texts and gives no embeddings"
        )
