"""CUDA graphs for decode-only steps (backends/torch_engine/cuda_graphs.py).

On CPU: the pure parts (sizes, padding, staging, routing, the on/off decision), the padded fixed-shape metadata
through the reference, torch and (interpreted, fp32) Triton attention, and whole decode steps of a tiny model
through DecodeGraphs' static buffers (capture=False: the very step a graph captures, run eagerly) against the
eager runner.  On a CUDA GPU: graph replays against eager steps, and no host sync during a replay.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.api import LoadOptions
from backends.errors import ConfigError
from backends.modelspec import load_spec
from backends.torch_engine.cuda_graphs import (
    ENV_VAR,
    PAD_ROW,
    TABLE,
    DecodeGraphs,
    enabled_by_env,
    graph_sizes,
    is_graph_step,
    pick_size,
    stage_rows,
    step_inputs,
    unavailable_reason,
)
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.seams import BLOCK_SIZE, ScheduledRequest, SchedulerOutput
from kernels.attention import (
    allocate_kv_cache,
    build_attention_metadata,
    is_head_major,
    paged_attention_reference,
    paged_attention_torch,
)
from tests.gguf_factory import write_tiny_llama

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---- pure parts ------------------------------------------------------------------------------------------------


def test_graph_sizes_ladder() -> None:
    assert graph_sizes(1) == (1,)
    assert graph_sizes(8) == (1, 2, 4, 8)
    assert graph_sizes(13) == (1, 2, 4, 8, 13)
    assert graph_sizes(16) == (1, 2, 4, 8, 16)
    assert graph_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert graph_sizes(41) == (1, 2, 4, 8, 16, 24, 32, 40, 41)
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_sizes(0)


def test_pick_size_is_the_smallest_that_holds_the_batch() -> None:
    sizes = graph_sizes(32)
    assert [pick_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 13, 16, 17, 32)] == [1, 2, 4, 8, 8, 16, 16, 16, 24, 32]
    assert pick_size(33, sizes) is None and pick_size(0, sizes) is None


def test_stage_rows_writes_slots_lengths_tables_and_padding() -> None:
    rows = np.full((8, TABLE + 4), 99, dtype=np.int32)
    seqs = [(7, 17, (3, 9, 5)), (8, 0, (5,)), (9, 47, (1, 2, 4, 6))]
    stage_rows(rows, seqs, 4, BLOCK_SIZE)
    assert rows[0, : TABLE + 2].tolist() == [7, 17, 9 * 16 + 1, 18, 3, 9]
    assert rows[1, : TABLE + 1].tolist() == [8, 0, 5 * 16, 1, 5]
    assert rows[2, : TABLE + 3].tolist() == [9, 47, 4 * 16 + 15, 48, 1, 2, 4]
    assert rows[3, : TABLE + 1].tolist() == list(PAD_ROW)  # padding: no KV write (slot -1), attends to block 0
    assert (rows[4:] == 99).all()  # rows past the size are not touched
    # Table entries past a sequence's blocks keep stale values (never read): block 5 of row 0 was not needed
    assert rows[0, TABLE + 2] == 99 and rows[2, TABLE + 3] == 99
    stage_rows(rows, [(1, 5, (6,))], 2, BLOCK_SIZE)  # a smaller batch later: the old rows become padding
    assert rows[0, : TABLE + 1].tolist() == [1, 5, 6 * 16 + 5, 6, 6]
    assert rows[1, : TABLE + 1].tolist() == list(PAD_ROW)


def _decode(rid: str, pos: int, table: tuple[int, ...], token: int = 1) -> ScheduledRequest:
    return ScheduledRequest(rid, (token,), pos, table, True, is_decode=True)


def test_only_decode_only_steps_that_fit_take_a_graph() -> None:
    decodes = [_decode("a", 20, (1, 2)), _decode("b", 3, (3,))]
    assert is_graph_step(decodes, 4, 64)
    chunk = ScheduledRequest("c", (5, 6, 7), 0, (4,), True)
    assert not is_graph_step(decodes + [chunk], 4, 64)  # mixed: a prompt chunk rides along
    one_token_prompt = ScheduledRequest("d", (5,), 0, (4,), True)  # one token, but a prompt (not is_decode)
    assert not is_graph_step(decodes + [one_token_prompt], 4, 64)
    assert not is_graph_step(decodes * 3, 4, 64)  # more sequences than the largest graph
    assert not is_graph_step([_decode("e", 64, (1, 2, 3, 4, 5))], 4, 64)  # context past the table width
    assert is_graph_step([_decode("e", 63, (1, 2, 3, 4))], 4, 64)
    assert not is_graph_step([], 4, 64)


def test_env_switch() -> None:
    assert enabled_by_env({}) and enabled_by_env({ENV_VAR: "1"}) and enabled_by_env({ENV_VAR: "on"})
    assert not enabled_by_env({ENV_VAR: "0"}) and not enabled_by_env({ENV_VAR: "off"})
    with pytest.raises(ConfigError, match=ENV_VAR):
        enabled_by_env({ENV_VAR: "maybe"})


def test_unavailable_reasons() -> None:
    gpu = torch.device("cuda")
    weights = torch.nn.Linear(2, 2)  # on the CPU
    assert "HEARTH_CUDA_GRAPHS=0" in unavailable_reason(gpu, "triton", torch.nn.Module(), {ENV_VAR: "0"})
    assert "device cpu" in unavailable_reason(torch.device("cpu"), "triton", weights, {})
    assert "'torch'" in unavailable_reason(gpu, "torch", torch.nn.Module(), {})
    assert "not on cuda" in unavailable_reason(gpu, "triton", weights, {})
    streamed = torch.nn.Module()
    streamed.offload = object()  # what offload.offload_layers sets on the model
    assert "offload" in unavailable_reason(gpu, "triton", streamed, {})
    assert unavailable_reason(gpu, "triton", torch.nn.Module(), {}) is None


# ---- padded, fixed-shape metadata through the attention implementations -------------------------------------

LENS = [1, 16, 17, 33, 5]  # contexts after this step; block boundaries on either side


def _pool(kv_heads: int, head_dim: int, dtype: torch.dtype):
    """Caches with each sequence's blocks scattered, block 0 left for padding rows, and one NaN block that
    stale table entries point at (read it and the output is NaN)."""
    need = [-(-n // BLOCK_SIZE) for n in LENS]
    pool = sum(need) + 2
    k = torch.randn(pool, BLOCK_SIZE, kv_heads, head_dim, dtype=dtype)
    v = torch.randn_like(k)
    poison = pool - 1
    k[poison] = float("nan")
    v[poison] = float("nan")
    ids = list(range(1, poison))
    random.Random(0).shuffle(ids)
    tables, at = [], 0
    for n in need:
        tables.append(tuple(ids[at : at + n]))
        at += n
    return k, v, tables, poison


def _staged(tables: list[tuple[int, ...]], poison: int, size: int, width: int) -> np.ndarray:
    rows = np.full((size + 3, TABLE + width), poison, dtype=np.int32)  # stale entries: the NaN block
    stage_rows(rows, [(0, n - 1, t) for n, t in zip(LENS, tables)], size, BLOCK_SIZE)
    return rows


@pytest.mark.parametrize("head_major", [False, True])
def test_padded_metadata_gives_the_same_attention_reference_and_torch(head_major: bool) -> None:
    torch.manual_seed(0)
    k, v, tables, poison = _pool(2, 32, torch.float32)
    if head_major:  # the CPU runner's layout
        k, v = (allocate_kv_cache(*t.shape, t.dtype, "cpu", head_major=True).copy_(t) for t in (k, v))
        assert is_head_major(k) and is_head_major(v)
    size, width = 8, 6
    rows = _staged(tables, poison, size, width)
    padded = [
        (int(r[1]), 1, tuple(int(b) for b in r[TABLE : TABLE + -(-int(r[3]) // BLOCK_SIZE)])) for r in rows[:size]
    ]
    unpadded = build_attention_metadata([(n - 1, 1, t) for n, t in zip(LENS, tables)], BLOCK_SIZE)
    meta = build_attention_metadata(padded, BLOCK_SIZE)
    q = torch.randn(size, 4, 32)
    for attention in (paged_attention_reference, paged_attention_torch):
        want = attention(q[: len(LENS)], k, v, unpadded, 0.2)
        got = attention(q, k, v, meta, 0.2)
        torch.testing.assert_close(got[: len(LENS)], want, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(got[len(LENS) :]).all()  # padding rows attend to block 0: finite


@pytest.mark.kernels
def test_graph_step_inputs_through_the_triton_kernels() -> None:
    """The fixed-shape views a graph reads (step_inputs) through the interpreted Triton attention and KV write:
    real rows match the unpadded reference, padded rows write nothing, stale table entries are never read."""
    from kernels.attention_triton import paged_attention_triton
    from kernels.kv_write_triton import kv_write_triton

    torch.manual_seed(1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the interpreter (TRITON_INTERPRET=1) runs them
    k, v, tables, poison = _pool(2, 32, torch.float32)
    k, v = k.to(dev), v.to(dev)
    size, width = 8, 6
    rows = torch.from_numpy(_staged(tables, poison, size, width))[:size].to(dev)
    input_ids, positions, meta = step_inputs(rows, BLOCK_SIZE)
    assert positions.tolist() == [n - 1 for n in LENS] + [0] * (size - len(LENS))
    assert meta.slot_mapping.tolist()[len(LENS) :] == [-1] * (size - len(LENS))
    new_k, new_v = torch.randn(size, 2, 32).to(dev), torch.randn(size, 2, 32).to(dev)
    k_before = k.clone()
    kv_write_triton(new_k, new_v, k, v, meta.slot_mapping, meta.memo)
    written = torch.zeros(k.shape[:2], dtype=torch.bool, device=dev)
    for s, (n, t) in enumerate(zip(LENS, tables)):
        blk, off = t[(n - 1) // BLOCK_SIZE], (n - 1) % BLOCK_SIZE
        written[blk, off] = True
        torch.testing.assert_close(k[blk, off], new_k[s])
    assert torch.equal(k[~written].nan_to_num(7.0), k_before[~written].nan_to_num(7.0))  # padding wrote nothing
    q = torch.randn(size, 4, 32).to(dev)
    got = paged_attention_triton(q, k, v, meta, 0.2)
    unpadded = build_attention_metadata([(n - 1, 1, t) for n, t in zip(LENS, tables)], BLOCK_SIZE, dev)
    want = paged_attention_reference(q[: len(LENS)], k, v, unpadded, 0.2)
    torch.testing.assert_close(got[: len(LENS)], want, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(got).all()


# ---- whole steps of a tiny model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_llama(Path(tmp_path_factory.mktemp("cg")) / "tiny.gguf", tokenizer="spm")
    return load_spec(path)


def _runner(spec, device: str, dtype: str = "float32", max_num_seqs: int = 16) -> ModelRunner:
    # n_gpu_layers=-1: every layer resident on a GPU (offloaded layers turn graphs off)
    from tests.kernels.conftest import skip_triton_on_cpu_without_interpreter

    skip_triton_on_cpu_without_interpreter(device)
    options = LoadOptions(n_ctx=64, max_num_seqs=max_num_seqs, dtype=dtype, device=device, n_gpu_layers=-1)
    return ModelRunner(spec, options, "triton")


def _eager_only(runner: ModelRunner) -> ModelRunner:
    runner._graphs_decided, runner.cuda_graphs_off = True, "off (test: the eager twin)"
    return runner


class _Steps:
    """Drives identical steps through several runners: prompts of the given lengths prefilled in one step, then
    greedy decodes (tokens chosen from the first runner's logits), every request on its own shuffled blocks."""

    def __init__(self, prompt_lens: list[int], vocab: int, num_blocks: int) -> None:
        rng = random.Random(len(prompt_lens))
        blocks = list(range(1, num_blocks))
        rng.shuffle(blocks)
        per = 64 // BLOCK_SIZE
        self.tables = [tuple(blocks[i * per : (i + 1) * per]) for i in range(len(prompt_lens))]
        self.tokens = [[rng.randrange(vocab) for _ in range(n)] for n in prompt_lens]

    def prefill(self) -> SchedulerOutput:
        return SchedulerOutput(
            tuple(ScheduledRequest(str(i), tuple(t), 0, self.tables[i], True) for i, t in enumerate(self.tokens))
        )

    def decode(self) -> SchedulerOutput:
        return SchedulerOutput(
            tuple(_decode(str(i), len(t) - 1, self.tables[i], t[-1]) for i, t in enumerate(self.tokens))
        )

    def take(self, logits: torch.Tensor) -> None:
        for t, nxt in zip(self.tokens, logits.argmax(dim=-1).tolist()):
            t.append(nxt)


def _compare(
    spec,
    device: str,
    prompt_lens: list[int],
    steps: int,
    graphs: Callable[[ModelRunner], DecodeGraphs] | None = None,
    dtype: str = "float32",
    atol: float = 1e-4,
) -> tuple[ModelRunner, ModelRunner]:
    """An eager runner and a graph runner through the same prefill and `steps` decodes: same logits each step,
    and the same KV pool at the end (padded rows wrote nothing).  graphs: builds the graph runner's
    DecodeGraphs (None: the runner's own choice)."""
    eager = _eager_only(_runner(spec, device, dtype))
    graphed = _runner(spec, device, dtype)
    if graphs is not None:
        graphed._graphs_decided, graphed.decode_graphs = True, graphs(graphed)
    drive = _Steps(prompt_lens, spec.vocab_size, eager.num_blocks)
    first = [r.execute(drive.prefill()) for r in (eager, graphed)]
    assert "cuda_graph" not in first[1].extra  # a prefill step runs eagerly
    drive.take(first[0].logits)
    for _ in range(steps):
        out = drive.decode()
        want, got = eager.execute(out), graphed.execute(out)
        assert got.extra.get("cuda_graph") and "cuda_graph" not in want.extra
        assert got.request_ids == want.request_ids
        scale = max(1.0, want.logits.abs().max().item())
        torch.testing.assert_close(got.logits, want.logits, atol=atol * scale, rtol=0)
        drive.take(want.logits)
    # A K/V computed in a batch of 16 rows instead of 13 may round to the neighbouring value of an fp16 cache
    # (the CUDA default): allow about two of its steps at |K| < 1.  A padded row writing token 0's K/V into
    # block 0 (never written by the eager twin: zeros) would differ by that K/V itself.
    kv_atol = atol if eager.kv_dtype == torch.float32 else max(atol, 2e-3)
    for (ke, ve), (kg, vg) in zip(eager.kv_caches, graphed.kv_caches):
        torch.testing.assert_close(kg, ke, atol=kv_atol, rtol=0)
        torch.testing.assert_close(vg, ve, atol=kv_atol, rtol=0)
    return eager, graphed


def _static(runner: ModelRunner) -> DecodeGraphs:
    return DecodeGraphs(
        runner.model,
        runner.kv_caches,
        runner.options.max_num_seqs,
        64 // BLOCK_SIZE,
        BLOCK_SIZE,
        runner.device,
        capture=False,
    )


@pytest.mark.kernels
@pytest.mark.parametrize("prompt_lens,steps", [([14], 4), ([3, 15, 16, 1, 30, 9, 12, 13, 2, 17, 31, 8, 5], 3)])
def test_static_buffer_steps_match_eager_steps_on_cpu(tiny_spec, prompt_lens: list[int], steps: int) -> None:
    """Batch 1 (a graph of 1) and 13 (padded to 16), contexts crossing block boundaries (14 -> 18, 15 -> 18,
    30 -> 33...), through the Triton kernels under the interpreter."""
    _, graphed = _compare(tiny_spec, "cpu", prompt_lens, steps, _static)
    assert graphed.describe()["cuda_graphs"] == "on"
    assert graphed.describe()["cuda_graph_sizes"] == (1, 2, 4, 8, 16)


@pytest.mark.kernels
def test_mixed_steps_run_eagerly(tiny_spec) -> None:
    runner = _runner(tiny_spec, "cpu")
    runner._graphs_decided, runner.decode_graphs = True, _static(runner)
    drive = _Steps([5, 20], tiny_spec.vocab_size, runner.num_blocks)
    drive.take(runner.execute(drive.prefill()).logits)
    spare = sorted(set(range(1, runner.num_blocks)) - set(drive.tables[0]) - set(drive.tables[1]))
    late = ScheduledRequest("late", (1, 2, 3), 0, (spare[0],), True)
    mixed = runner.execute(SchedulerOutput(drive.decode().scheduled + (late,)))
    assert "cuda_graph" not in mixed.extra and mixed.request_ids == ("0", "1", "late")
    assert runner.execute(drive.decode()).extra.get("cuda_graph")  # the same decodes alone: a graph step
    too_long = SchedulerOutput((_decode("0", 64, drive.tables[0] + (spare[1],)),))  # past the graphs' width
    assert "cuda_graph" not in runner.execute(too_long).extra


def test_describe_says_why_graphs_are_off(tiny_spec, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(tiny_spec, LoadOptions(n_ctx=64, max_num_seqs=4, dtype="float32", device="cpu"))
    assert runner.describe()["cuda_graphs"] == "off (device cpu)"
    monkeypatch.setenv(ENV_VAR, "0")
    assert runner.describe()["cuda_graphs"] == f"off ({ENV_VAR}=0)"
    monkeypatch.setenv(ENV_VAR, "sometimes")
    with pytest.raises(ConfigError, match=ENV_VAR):  # describe() runs at load: a bad value stops the load
        runner.describe()


def test_graphs_need_the_triton_kernels(tiny_spec) -> None:
    runner = ModelRunner(tiny_spec, LoadOptions(n_ctx=64, max_num_seqs=4, dtype="float32", device="cpu"), "torch")
    with pytest.raises(ValueError, match="Triton"):
        _static(runner)


# ---- on a GPU ----------------------------------------------------------------------------------------------------


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("prompt_lens", [[14], [3, 15, 16, 1, 30, 9, 12, 13, 2, 17, 31, 8, 5]])
def test_graph_replay_matches_eager_steps_cuda(tiny_spec, prompt_lens: list[int]) -> None:
    """fp32 compute (IEEE attention, no TF32 in cuBLAS by default) over the default fp16 cache: batch 1 and 13
    (replayed at 16) over 20 decodes, every context crossing at least one block boundary."""
    _, graphed = _compare(tiny_spec, "cuda", prompt_lens, 20, atol=1e-3)
    info = graphed.describe()
    assert info["cuda_graphs"] == "on" and info["cuda_graphs_captured"] == (1 if len(prompt_lens) == 1 else 16,)


@cuda
@pytest.mark.gpu
def test_graph_replay_bf16_cuda(tiny_spec) -> None:
    _compare(tiny_spec, "cuda", [7, 16, 17], 18, dtype="bfloat16", atol=5e-2)


@cuda
@pytest.mark.gpu
def test_replay_does_not_sync_with_the_host_cuda(tiny_spec) -> None:
    runner = _runner(tiny_spec, "cuda")
    drive = _Steps([15, 2, 30], tiny_spec.vocab_size, runner.num_blocks)
    drive.take(runner.execute(drive.prefill()).logits)
    drive.take(runner.execute(drive.decode()).logits)  # captures the graph of 4
    outs = []
    torch.cuda.set_sync_debug_mode("error")  # any implicit sync (.item(), pageable copies) raises
    try:
        for _ in range(3):  # 16 -> 19 crosses a block boundary inside the sync-free stretch
            outs.append(runner.execute(drive.decode()))
            for t in drive.tokens:  # feed the last token again: no argmax on the host inside the stretch
                t.append(t[-1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(o.extra.get("cuda_graph") for o in outs)
    assert all(torch.isfinite(o.logits).all() for o in outs)


def test_a_capture_out_of_memory_turns_graphs_off_and_the_step_runs_eagerly(tiny_spec) -> None:
    class OutOfMemoryGraphs:  # a DecodeGraphs whose capture cannot grow its memory pool
        def accepts(self, scheduled) -> bool:
            return True

        def run(self, seqs):
            raise torch.OutOfMemoryError("CUDA out of memory (test)")

    runner = ModelRunner(tiny_spec, LoadOptions(n_ctx=64, max_num_seqs=4, dtype="float32", device="cpu"))
    twin = ModelRunner(tiny_spec, LoadOptions(n_ctx=64, max_num_seqs=4, dtype="float32", device="cpu"))
    runner._graphs_decided, runner.decode_graphs = True, OutOfMemoryGraphs()
    drive = _Steps([9], tiny_spec.vocab_size, runner.num_blocks)
    for r in (runner, twin):
        r.execute(drive.prefill())
    got, want = runner.execute(drive.decode()), twin.execute(drive.decode())
    assert "cuda_graph" not in got.extra
    torch.testing.assert_close(got.logits, want.logits)
    assert runner.decode_graphs is None and "out of GPU memory" in runner.describe()["cuda_graphs"]
