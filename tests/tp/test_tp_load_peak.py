"""Tensor-parallel loading reads each rank's share only (issue 25): two gloo ranks on CPU load a float32 model of
~190 MB; each rank's peak anonymous memory while loading (RssAnon, sampled) stays within its own share
plus the KV pool and a small allowance, far below the whole model that every rank used to read, dequantize
and hold before cutting it."""

from __future__ import annotations

import multiprocessing as mp
import socket
from pathlib import Path

import pytest

from tests.gguf_factory import write_tiny_llama

pytestmark = pytest.mark.timeout(300)

SHAPE = dict(n_layers=4, hidden=1024, n_heads=8, n_kv_heads=4, ffn=2816, tokenizer="spm", seed=3, weight_type="F32")
ALLOWANCE = 48 * 2**20  # the loader's dequantize chunk (16 MiB of float32), numpy's copy of it, allocator slack


def _vm(field: str) -> int:
    """A /proc/self/status figure in bytes.  The peak is RssAnon's, sampled every 2 ms while loading: the pages
    of the GGUF's mmap count in VmRSS / VmHWM too, but they are the file's page cache (shared, dropped under
    pressure), not memory the load allocates."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _rank(rank: int, world: int, port: int, path: str, out) -> None:  # type: ignore[no-untyped-def]
    import torch

    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner
    from backends.torch_engine.tp.comm import init_group

    spec = load_spec(path)
    comm = init_group(rank, world, port, torch.device("cpu"), store=None if rank else _store(port, world))
    options = LoadOptions(n_ctx=64, max_num_seqs=1, dtype="float32", device="cpu", weight_quant="none")
    import threading

    anon0 = _vm("RssAnon")
    peak_anon = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak_anon[0] = max(peak_anon[0], _vm("RssAnon") - anon0)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    runner = ModelRunner(spec, options, tp=comm)
    done.set()
    t.join()
    out.put((rank, peak_anon[0], runner.weight_bytes, runner.kv_cache_bytes))


def _store(port: int, world: int):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, world, is_master=True, timeout=timedelta(seconds=60))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_reads_and_holds_only_its_share(tmp_path: Path) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc/self/status")
    path = write_tiny_llama(tmp_path / "tp.gguf", **SHAPE)
    whole = path.stat().st_size  # float32: the file is the dense model (plus a small vocabulary)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(path), out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
    for rank, peak, weights, kv in results:
        assert weights < 0.6 * whole, (rank, weights, whole)  # a share, not the model
        assert peak <= weights + kv + ALLOWANCE, (rank, peak >> 20, weights >> 20, kv >> 20)
        assert peak < 0.75 * whole, (rank, peak >> 20, whole >> 20)
