"""Embeddings in batches on the torch engine (ModelRunner.embed_batch): several inputs packed into one forward
give the vectors each input gives alone (within float tolerance: batched matmuls may round differently), in
fewer forwards, for every pooling, also when the free KV blocks hold only part of the batch.  float32 weights:
in bf16 a batch's vectors differ from one-by-one by up to ~3e-3 (cosine 0.99998) where the GEMM shapes round
differently."""

from __future__ import annotations

import numpy as np
import pytest

from backends.api import LoadOptions
from backends.errors import ContextOverflowError
from backends.modelspec import load_spec

pytestmark = pytest.mark.slow

N_BATCH = 16  # tokens per forward: the 40-token input spans three
TEXTS = [
    "The capital of France is Paris, a city on the Seine known for its museums, its cafes, its long boulevards "
    "and the iron tower that Gustave Eiffel built for the world fair of 1889.",
    "Bananas are a yellow fruit.",
    "Paris is the French capital.",
    "Hello",
    "Water boils at one hundred degrees Celsius at sea level.",
]


@pytest.fixture(scope="module")
def backend(starter_path):
    from backends.torch_engine.backend import TorchBackend

    options = LoadOptions(n_ctx=256, max_num_seqs=2, n_batch=N_BATCH, n_threads=2, device="cpu", dtype="float32")
    with TorchBackend(load_spec(starter_path), options) as b:
        yield b


@pytest.fixture(scope="module")
def inputs(backend) -> list[list[int]]:
    ids = [backend.tokenize(t, add_special=True, parse_special=False) for t in TEXTS]
    ids.insert(2, ids[3][:1])  # a one-token input
    lengths = [len(i) for i in ids]
    assert max(lengths) > 2 * N_BATCH and min(lengths) == 1 and len(set(lengths)) > 3, lengths
    return ids


def _count_forwards(backend, monkeypatch) -> list[int]:
    """Record the number of tokens of every model forward."""
    model = backend._parts.runner.model
    calls: list[int] = []
    forward = model.forward

    def counting(input_ids, *args, **kwargs):
        calls.append(int(input_ids.shape[0]))
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    return calls


def _embed(backend, group: list[list[int]], pooling: str) -> np.ndarray:
    """One packed run of `group` on the engine thread with the given pooling (whatever the model's own is)."""
    from backends.torch_engine.backend import _embed_on_engine

    fn = backend._parts.runner.embed_batch
    return np.stack(backend._call(lambda: _embed_on_engine(backend._engine, fn, group, pooling)))


def _assert_same(batched: np.ndarray, alone: np.ndarray) -> None:
    assert batched.shape == alone.shape and batched.dtype == np.float32
    cosines = (batched * alone).sum(axis=1)
    assert (cosines > 0.9999).all(), cosines
    assert np.allclose(batched, alone, atol=1e-4), np.abs(batched - alone).max()


def test_a_batch_gives_each_inputs_vector_in_fewer_forwards(backend, inputs, monkeypatch) -> None:
    calls = _count_forwards(backend, monkeypatch)
    alone = np.concatenate([backend.embed([ids]) for ids in inputs])
    one_by_one = len(calls)
    assert one_by_one == sum(-(-len(ids) // N_BATCH) for ids in inputs)
    calls.clear()
    batched = backend.embed(inputs)
    _assert_same(batched, alone)
    assert np.allclose(np.linalg.norm(batched, axis=1), 1, atol=1e-5)
    assert len(calls) < len(inputs) and len(calls) < one_by_one, calls
    assert max(calls) <= N_BATCH, calls
    assert batched[1] @ batched[3] > batched[1] @ batched[2]  # the two sentences about Paris are closest


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_every_pooling_agrees_with_one_by_one(backend, inputs, pooling, monkeypatch) -> None:
    calls = _count_forwards(backend, monkeypatch)
    batched = _embed(backend, inputs, pooling)  # the whole list in one packed run
    assert len(calls) == -(-sum(len(ids) for ids in inputs) // N_BATCH), calls
    alone = np.concatenate([_embed(backend, [ids], pooling) for ids in inputs])
    _assert_same(batched, alone)
    runner = backend._parts.runner  # ModelRunner.embed is a batch of one
    single = backend._call(lambda: _embed_on_engine_single(backend, runner, inputs[0], pooling))
    assert np.allclose(single, alone[0], atol=1e-5)


def _embed_on_engine_single(backend, runner, ids: list[int], pooling: str) -> np.ndarray:
    from backends.api import SamplingParams
    from backends.torch_engine.request import EngineRequest

    bm = backend._engine.scheduler.block_manager
    scratch = EngineRequest("embed", tuple(ids), SamplingParams(temperature=0))
    assert bm.allocate(scratch, len(ids))
    try:
        return runner.embed(ids, tuple(scratch.block_ids), pooling).numpy()
    finally:
        bm.free(scratch)


def test_short_of_blocks_the_batch_goes_in_smaller_groups(backend, inputs) -> None:
    from backends.api import SamplingParams
    from backends.torch_engine.request import EngineRequest

    reference = np.concatenate([backend.embed([ids]) for ids in inputs])
    bm = backend._engine.scheduler.block_manager
    need = bm.blocks_needed(len(inputs[0]))
    hog = EngineRequest("hog", (1,), SamplingParams(temperature=0))  # leaves the blocks of the first input
    assert backend._call(lambda: bm.allocate(hog, (bm.num_free_blocks - need) * bm.block_size))
    try:
        assert backend._call(lambda: bm.num_free_blocks) == need
        first = _embed(backend, inputs, "last")  # only the first input's blocks are free: it runs alone
        assert first.shape == (1, reference.shape[1])
        batched = backend.embed(inputs)  # groups as the free blocks allow
        _assert_same(batched, reference)
        with pytest.raises(ContextOverflowError, match="KV blocks but only"):
            backend.embed([[5] * ((need + 1) * bm.block_size)])
        assert backend._call(lambda: bm.num_free_blocks) == need  # every scratch block came back
    finally:
        backend._call(lambda: bm.free(hog))
