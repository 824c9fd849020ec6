"""CUDA graphs for decode-only steps: one graph per padded batch size, replayed after one host-to-device copy
with no host sync; nothing is allocated per step but the real rows' logits (torch's caching allocator).

Why: an eager decode step is about 20 kernel launches per layer (counted in models/llama.py with the Triton
kernel set: norms, matmuls, RoPE, KV write, the attention and its split merge), each paying Python and launch
overhead on the host (Triton's launcher is the dearest), while the GPU's own work at batch 1 is one read of
the weights: eager decoding is bound by the host.  A replayed graph is one launch; scripts/gpu_bench.py prints
the two side by side.

What a graph step is.  The scheduled decodes (one token each) are padded up to the smallest captured size
(`graph_sizes`: 1, 2, 4, 8, then every 8 up to max_num_seqs) and staged as fixed-shape int32 rows
(`stage_rows`) in a pinned host buffer of `max_size x (4 + max_blocks)`: token, position, KV slot, context
length, then the block table.  One non-blocking copy moves the first `size` rows to the same buffer on the
device, and the graph captured for `size` reads everything from there:
- the Triton KV write skips slot -1, so a padded row (token 0 at position 0, PAD_ROW) writes no K/V;
- the Triton attention takes its block tables and lengths from AttentionMetadata.memo (kernels/
  attention_triton.py BLOCK_TABLES, SEQ_LENS) and sizes its grid by the table width, which is fixed at the
  blocks of a whole context; a padded row attends to slot 0 of block 0 (finite, whatever it holds) and
  table entries past a sequence's blocks are never read, so stale ones need no clearing;
- the final hidden states are copied into one buffer outside the graphs' memory pool, and the logits of the
  real rows only are computed eagerly from it (padded rows never reach the lm head; no graph keeps a
  max_size x vocab output alive).
The graph's own AttentionMetadata has empty host tuples (context_lens, block_tables): they are not any
replayed step's values, and only the Triton kernel set (which never reads them) may run in a graph.

Graphs are captured lazily, the first time a step needs a size: a warm-up run on a side stream first (Triton
compiles and cuBLAS picks its kernels outside the capture), on padding rows only (no K/V written), then the
capture, into one memory pool shared by all sizes (they never run concurrently).  They apply only on CUDA
with the "triton" kernel set and every weight on the GPU; `unavailable_reason` says why not otherwise, and
HEARTH_CUDA_GRAPHS=0 turns them off.  With capture=False (CPU, the Triton interpreter) DecodeGraphs runs the
very same padded fixed-shape step eagerly on its static buffers: that is how the staging is tested without a GPU.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

import torch

from backends.torch_engine.quantize import QUANTIZED_ROWS
from kernels.attention import AttentionMetadata

ENV_VAR = "HEARTH_CUDA_GRAPHS"
TOKEN, POSITION, SLOT, CONTEXT_LEN, TABLE = range(5)  # columns of a staged row; the block table starts at TABLE
PAD_ROW = (0, 0, -1, 1, 0)  # token 0 at position 0, no KV write, attends to one token of block 0


def graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 (vLLM's ladder), ending at max_num_seqs itself.  A batch
    runs at the smallest size holding it, so past 8 at most 7 rows are padding."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    small = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    return tuple(small + list(range(16, max_num_seqs, 8)) + [max_num_seqs])


def pick_size(num_seqs: int, sizes: Sequence[int]) -> int | None:
    """The smallest of `sizes` (ascending) that holds num_seqs rows; None when none does."""
    i = bisect_left(sizes, num_seqs)
    return sizes[i] if num_seqs >= 1 and i < len(sizes) else None


def is_graph_step(scheduled: Sequence[Any], max_seqs: int, max_tokens: int) -> bool:
    """Whether a step can replay a graph: every scheduled request (seams.ScheduledRequest) is a one-token decode,
    there are at most max_seqs of them, and every context fits the graphs' table width (max_tokens)."""
    return (
        0 < len(scheduled) <= max_seqs
        and all(s.is_decode and s.num_tokens == 1 for s in scheduled)
        and max(s.end_position for s in scheduled) <= max_tokens
    )


def stage_rows(rows: Any, seqs: Sequence[tuple[int, int, Sequence[int]]], size: int, block_size: int) -> None:
    """Write a decode batch into rows[:size] of an int32 (>= size, TABLE + width) numpy array, in place.

    seqs: (token, position, block_table) per sequence; row r gets (token, position, slot of position, context
    length position + 1, the blocks holding positions 0..position).  Rows len(seqs)..size are PAD_ROW.  Table
    entries past a sequence's blocks keep whatever they held: no kernel reads them."""
    n = len(seqs)
    assert n <= size <= rows.shape[0], f"{n} sequences in {size} of {rows.shape[0]} rows"
    if n:
        rows[:n, :TABLE] = [
            (token, pos, table[pos // block_size] * block_size + pos % block_size, pos + 1)
            for token, pos, table in seqs
        ]
    for r, (_, pos, table) in enumerate(seqs):
        blocks = pos // block_size + 1
        assert len(table) >= blocks, f"block table of {len(table)} blocks for position {pos}"
        rows[r, TABLE : TABLE + blocks] = table[:blocks]
    rows[n:size, : TABLE + 1] = PAD_ROW


def step_inputs(rows: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(input_ids, positions, meta) of a staged decode batch, all derived on the device from `rows` ((size,
    TABLE + width) int32, the device copy of stage_rows' output): the graph reads no host value.  meta's host
    tuples are empty; its tables are in memo for the Triton attention (kernels/attention_triton.py)."""
    # lazy: heavy: triton
    from kernels.attention_triton import BLOCK_TABLES, SEQ_LENS  # triton is imported only where it runs

    size = rows.shape[0]
    meta = AttentionMetadata(
        slot_mapping=rows[:, SLOT].contiguous(),
        query_start=tuple(range(size + 1)),
        context_lens=(),
        block_tables=(),
        groups=(),
        block_size=block_size,
        memo={BLOCK_TABLES: rows[:, TABLE:], SEQ_LENS: rows[:, CONTEXT_LEN].contiguous()},
    )
    return rows[:, TOKEN].long(), rows[:, POSITION].long(), meta


def enabled_by_env(environ: Mapping[str, str] = os.environ) -> bool:
    """HEARTH_CUDA_GRAPHS: unset, 1/on/true/yes -> on; 0/off/false/no -> off; anything else is a ConfigError."""
    value = environ.get(ENV_VAR, "1").strip().lower()
    if value in ("", "1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    # lazy: backends.errors loads hwprobe (16 modules, the planner), which scripts/gpu_bench.py's kernel-only
    # run must not import (its check_imports; tests/kernels/test_gpu_bench.py)
    from backends.errors import ConfigError

    raise ConfigError(f"{ENV_VAR} must be 1 or 0, got {value!r}", f"unset it or set {ENV_VAR}=0 to turn graphs off")


def unavailable_reason(
    device: torch.device, kernels: str, model: torch.nn.Module, environ: Mapping[str, str] = os.environ
) -> str | None:
    """None when decode steps may run as CUDA graphs, else why not (for describe())."""
    if not enabled_by_env(environ):
        return f"off ({ENV_VAR}=0)"
    if device.type != "cuda":
        return f"off (device {device.type})"
    if kernels != "triton":
        return f"off (kernels {kernels!r}; graphs need 'triton')"
    # A graph bakes in the addresses it reads and replays no Python: weights streamed in between the layers
    # (offload.py's hooks, copies and event waits) cannot be part of one.
    if getattr(model, "offload", None) is not None:
        return "off (layer offload streams weights between layers)"
    if any(getattr(m, "offload", None) is not None for m in model.modules() if m is not model):
        return "off (experts in host RAM: the expert cache decides its copies on the host each step)"
    away = sum(
        1
        for _, t in chain(model.named_parameters(), model.named_buffers())
        if t is not None and t.device.type != device.type
    )
    if away:
        return f"off ({away} weight tensors are not on {device.type}: offloaded layers)"
    return None


class DecodeGraphs:
    """Padded fixed-shape decode steps of `model` over `kv_caches`, one CUDA graph per size, captured on first use.

    model: forward(input_ids, positions, kv_caches, meta) -> (num_tokens, hidden) and compute_logits(hidden)
    (models/llama.py's LlamaModel), built with the "triton" kernel set.  kv_caches: the pool the graphs write
    into; it must outlive them.  max_blocks: table width, the blocks of the longest context.  capture=False
    runs the same step eagerly on the static buffers (no CUDA needed).

    run(seqs) -> (len(seqs), vocab) float32 logits, like ModelRunner.forward for a decode-only step."""

    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks: int,
        block_size: int,
        device: torch.device | str,
        capture: bool = True,
    ) -> None:
        if model.ops.name != "triton":
            raise ValueError(f"CUDA-graph steps read their tables through the Triton kernels, not {model.ops.name!r}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.device = torch.device(device)
        self.capture = capture
        self.sizes = graph_sizes(max_num_seqs)
        self.max_blocks = max_blocks
        shape = (self.sizes[-1], TABLE + max_blocks)
        # pinned, so that the per-step copy is asynchronous (from pageable memory it would sync)
        self.host = torch.zeros(shape, dtype=torch.int32, pin_memory=capture)
        self._rows = self.host.numpy()  # the same memory, written row by row from Python
        self._rows[:, : TABLE + 1] = PAD_ROW
        self.device_rows = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self._hidden: torch.Tensor | None = None  # (max_size, hidden): the graphs' output, outside their pool
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.captured: tuple[int, ...] = ()  # replaced, never mutated: describe() reads it from other threads
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        # recorded after each upload: the host rows are rewritten only once the device has read them
        self._uploaded = torch.cuda.Event() if capture else None

    @property
    def max_tokens(self) -> int:
        return self.max_blocks * self.block_size

    def accepts(self, scheduled: Sequence[Any]) -> bool:
        return is_graph_step(scheduled, self.sizes[-1], self.max_tokens)

    @torch.inference_mode()
    def run(self, seqs: Sequence[tuple[int, int, Sequence[int]]]) -> torch.Tensor:
        """seqs: (token, position, block_table) per decode, len(seqs) <= max_num_seqs, contexts <= max_tokens.
        A first step of a size captures its graph (torch.OutOfMemoryError when the pool cannot grow)."""
        size = pick_size(len(seqs), self.sizes)
        assert size is not None, f"{len(seqs)} sequences, graphs hold up to {self.sizes[-1]}"
        if not self.capture:
            self._upload(seqs, size)
            self._keep(self._forward(size), size)
        else:
            with torch.cuda.device(self.device):  # graphs capture and replay on the current device
                if size not in self._graphs:
                    self.capture_size(size)
                self._upload(seqs, size)
                self._graphs[size].replay()
        assert self._hidden is not None
        return self.model.compute_logits(self._hidden[: len(seqs)])

    @torch.inference_mode()
    def capture_size(self, size: int) -> None:
        """Warm up and capture the graph for `size` rows, on padding rows (no K/V is written).  Call it on the
        device's context (run does)."""
        assert self.capture and size in self.sizes
        self._upload((), size)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            hidden = self._forward(size)
        current.wait_stream(side)
        if self._hidden is None:  # allocated on the current stream, outside the graphs' pool
            self._hidden = torch.empty((self.sizes[-1], *hidden.shape[1:]), dtype=hidden.dtype, device=self.device)
        del hidden
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._hidden[:size].copy_(self._forward(size))
        self._graphs[size] = graph
        self.captured = tuple(sorted(self._graphs))

    def _upload(self, seqs: Sequence[tuple[int, int, Sequence[int]]], size: int) -> None:
        if self._uploaded is not None and not self._uploaded.query():
            self._uploaded.synchronize()  # the previous step's copy is still reading the host rows (rare)
        stage_rows(self._rows, seqs, size, self.block_size)
        self.device_rows[:size].copy_(self.host[:size], non_blocking=self.capture)
        if self._uploaded is not None:
            self._uploaded.record(torch.cuda.current_stream(self.device))

    def _forward(self, size: int) -> torch.Tensor:
        """The captured step: everything it reads comes from device_rows[:size] (fixed addresses)."""
        input_ids, positions, meta = step_inputs(self.device_rows[:size], self.block_size)
        token = QUANTIZED_ROWS.set(size)  # every row is a decode row (as ModelRunner.execute sets it)
        try:
            return self.model(input_ids, positions, self.kv_caches, meta)
        finally:
            QUANTIZED_ROWS.reset(token)

    def _keep(self, hidden: torch.Tensor, size: int) -> None:
        """capture=False: the step's output into the same buffer a graph would write."""
        if self._hidden is None:
            self._hidden = torch.empty((self.sizes[-1], *hidden.shape[1:]), dtype=hidden.dtype, device=self.device)
        self._hidden[:size].copy_(hidden)

    def describe(self) -> dict[str, Any]:
        return {"cuda_graph_sizes": self.sizes, "cuda_graphs_captured": self.captured}
