"""Issue 24 item 2: a KV pool in host RAM is reserved at load and committed in blocks as the block tables reach
them (backends/torch_engine/kv_pool.py), up to the plan's reservation; what a request computes does not depend
on when its blocks were committed.  Tiny random-weight GGUFs, CPU."""

from __future__ import annotations

from pathlib import Path

import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.kv_pool import COMMIT_TOKENS, KVPool
from backends.torch_engine.kv_pool import block_storage as _storage
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.seams import BLOCK_SIZE, ScheduledRequest, SchedulerOutput
from tests.gguf_factory import write_tiny_llama

STEP = COMMIT_TOKENS // BLOCK_SIZE  # blocks committed at a time


def _runner(tmp_path: Path) -> ModelRunner:
    path = write_tiny_llama(tmp_path / "tiny.gguf", context_length=1024)
    options = LoadOptions(n_ctx=1024, max_num_seqs=4, dtype="float32", n_batch=512, device="cpu")
    return ModelRunner(load_spec(path), options)


def _prompt(n: int, salt: int = 0) -> tuple[int, ...]:
    return tuple(1 + (7 * i + salt) % 200 for i in range(n))


def test_the_pool_is_reserved_at_load_and_committed_as_block_tables_reach_it(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    pool = runner.kv_pool
    assert runner.num_blocks == 4 * 1024 // BLOCK_SIZE == pool.num_blocks
    assert pool.num_committed == 0 and pool.committed_bytes == 0
    assert runner.kv_cache_bytes == pool.reserved_bytes == runner.num_blocks * pool.block_bytes  # = the plan's
    assert runner.describe()["kv_committed_bytes"] == 0

    runner.forward([(_prompt(20), 0, (0, 1))])
    assert pool.num_committed == STEP  # one step covers the first blocks
    runner.forward([(_prompt(20, 1), 0, (5, STEP + 3))])
    assert pool.num_committed == 2 * STEP
    runner.forward([(_prompt(3), 0, (runner.num_blocks - 1,))])  # the last block: everything, never more
    assert pool.num_committed == runner.num_blocks and pool.committed_bytes == pool.reserved_bytes
    assert runner.describe()["kv_committed_bytes"] == runner.kv_cache_bytes


def test_blocks_committed_late_compute_what_a_pool_committed_whole_computes(tmp_path: Path) -> None:
    """The uncommitted memory is filled with NaN first (what a heap allocation reusing freed memory could hold):
    committing zeroes it, and the logits equal those of a pool committed whole before anything ran."""
    grown = _runner(tmp_path)
    for k, v in grown.kv_caches:
        _storage(k).fill_(float("nan"))
        _storage(v).fill_(float("nan"))
    whole = _runner(tmp_path)
    whole.kv_pool.commit(whole.num_blocks)
    table = (3, 2 * STEP + 1, STEP + 4)  # out of order, across three commit steps
    ids = _prompt(40)
    for runner in (grown, whole):
        runner.kv_pool.ensure([table])  # (execute does this through forward; here a decode follows a chunk)
    steps = [
        SchedulerOutput((ScheduledRequest("a", ids[:33], 0, table, True),)),
        SchedulerOutput((ScheduledRequest("a", ids[33:34], 33, table, True, is_decode=True),)),
    ]
    for out in steps:
        a, b = grown.execute(out).logits, whole.execute(out).logits
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)


def test_a_gpu_pool_is_allocated_whole() -> None:
    pool = KVPool(8, BLOCK_SIZE, 2, 2, 16, torch.float32, torch.device("meta"))  # not host RAM: no growth
    assert pool.num_committed == pool.num_blocks == 8
