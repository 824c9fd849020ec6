"""Backend.embed on real models: the starter on both engines (same tokens, same pooling: cosine > 0.99), through
a runner process, and a tiny BERT GGUF in llama.cpp's encoder mode (an embedding model, refused for chat)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.api import LoadOptions, Request, SamplingParams
from backends.errors import ContextOverflowError, InvalidRequestError
from backends.modelspec import load_spec
from tests.bert_gguf_factory import write_tiny_bert

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is Paris.", "Bananas are a yellow fruit.", "Paris is the French capital."]


def _embed_all(backend) -> np.ndarray:
    ids = [backend.tokenize(t, add_special=True, parse_special=False) for t in TEXTS]
    return backend.embed(ids)


@pytest.fixture(scope="module")
def starter_vectors(starter_path):
    from backends.llama_cpp.backend import LlamaCppBackend
    from backends.torch_engine.backend import TorchBackend

    spec = load_spec(starter_path)
    out = {}
    for cls, options in (
        (LlamaCppBackend, LoadOptions(n_ctx=512, n_threads=2)),
        (TorchBackend, LoadOptions(n_ctx=512, max_num_seqs=2, n_batch=16, n_threads=2)),  # n_batch 16: chunks
    ):
        with cls(spec, options) as backend:
            out[cls.name] = _embed_all(backend)
            if cls is TorchBackend:  # embedding between chat steps leaves generation as it was
                req = Request(prompt="Hello", sampling=SamplingParams(temperature=0, max_tokens=4))
                assert backend.generate(req).finish_reason.value in ("stop", "length")
                with pytest.raises(ContextOverflowError):
                    backend.embed([[1] * 600])
            with pytest.raises(InvalidRequestError):
                backend.embed([[10**9]])
    return out


def test_both_engines_give_the_same_normalized_embeddings(starter_vectors) -> None:
    a, b = starter_vectors["llama.cpp"], starter_vectors["torch"]
    assert a.shape == b.shape == (3, 576) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5) and np.allclose(np.linalg.norm(b, axis=1), 1, atol=1e-5)
    cosines = (a * b).sum(axis=1)
    assert (cosines > 0.99).all(), cosines
    for v in (a, b):  # meaning: the two sentences about Paris are closer to each other than to bananas
        assert v[0] @ v[2] > v[0] @ v[1]


def test_embeddings_through_a_runner_process(starter_path) -> None:
    from backends.runner.client import RunnerBackend

    spec = load_spec(starter_path)
    with RunnerBackend(spec, LoadOptions(n_ctx=512, n_threads=2), backend="llama.cpp") as backend:
        v = _embed_all(backend)
        assert backend.capabilities.embeddings
    assert v.shape == (3, 576) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)


def test_a_bert_gguf_embeds_in_llama_cpp_and_refuses_chat(tmp_path) -> None:
    from backends.embeddings import is_embedding_model, pooling_type
    from backends.llama_cpp.backend import LlamaCppBackend

    mean = load_spec(write_tiny_bert(tmp_path / "mean.gguf", pooling=1))
    cls = load_spec(write_tiny_bert(tmp_path / "cls.gguf", pooling=2))
    assert is_embedding_model(mean) and (pooling_type(mean), pooling_type(cls)) == ("mean", "cls")
    vectors = {}
    for spec in (mean, cls):
        with LlamaCppBackend(spec, LoadOptions(n_ctx=4096, n_threads=1)) as backend:
            assert backend.n_ctx == 128  # an encoder's positions: its training context, whatever was asked
            ids = backend.tokenize("the cat sat on the mat", add_special=True, parse_special=False)
            assert ids[0] == 2 and ids[-1] == 3 and 1 not in ids  # [CLS] ... [SEP], no unknown pieces
            vectors[pooling_type(spec)] = backend.embed([ids, backend.tokenize("paris is the capital of france")])
            with pytest.raises(InvalidRequestError, match="embedding model"):
                backend.generate(Request(prompt="hello"))
            with pytest.raises(ContextOverflowError):
                backend.embed([[5] * 129])
    for v in vectors.values():
        assert v.shape == (2, 32) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert not np.allclose(vectors["mean"], vectors["cls"])  # the file's own pooling is the one applied
