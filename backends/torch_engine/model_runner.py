"""ModelRunner: owns the model and the paged KV cache pool; runs one scheduler step in one forward.

`execute(SchedulerOutput)` flattens the scheduled tokens of every request (decodes and prefill chunks alike),
builds positions and the slot mapping from the block tables, runs the model once (K/V are written into the
cache through the slot mapping inside each layer) and returns float32 logits for the requests that need them.

The pool (backends/torch_engine/kv_pool.py): per layer one K and one V tensor of shape (num_blocks, BLOCK_SIZE,
n_kv_heads, head_dim), sized from LoadOptions.kv_cache_bytes, else max_num_seqs x n_ctx tokens
(backends.torch_engine.parts.kv_pool_blocks); in host RAM its blocks are committed as the block tables reach them.
On a GPU with swap space (LoadOptions.swap_space_bytes) it also makes the step's KV block copies to and from
host RAM (kv_swap.py) before the forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from backends.api import LoadOptions
from backends.engine_options import TorchOptions
from backends.errors import ConfigError
from backends.modelspec import ModelSpec
from backends.thread_tuner import ThreadTuner
from backends.torch_engine.cpu_head import Int8RowsHead
from backends.torch_engine.cuda_graphs import DecodeGraphs, unavailable_reason
from backends.torch_engine.describe import describe_runner
from backends.torch_engine.devices import resolve_device
from backends.torch_engine.kernel_check import GRAPH_BLOCKERS, check_model, record_graph_check
from backends.torch_engine.kv_pool import KVPool
from backends.torch_engine.kv_swap import HostKVStore, KVSwapper, measure_bandwidth
from backends.torch_engine.model_load import dense_copy_budget as dense_copy_budget  # hwprobe/memory.py names it here
from backends.torch_engine.model_load import (
    load_runner_model,
    release_load_memory,
    resident_layers,
    setup_threads,
)
from backends.torch_engine.offload import LayerStreamer
from backends.torch_engine.parts import kv_pool_blocks
from backends.torch_engine.quantize import DENSE_MIN_ROWS, MIXED, QUANTIZED_ROWS, QuantLinear
from backends.torch_engine.scripted_decode import install as install_scripted
from backends.torch_engine.seams import BLOCK_SIZE, RunnerOutput, ScheduledRequest, SchedulerOutput
from backends.torch_engine.swap_cost import SwapCost
from kernels.attention import build_attention_metadata
from kernels.dispatch import kernel_set
from kernels.selfcheck import TOLERANCES

if TYPE_CHECKING:  # pragma: no cover
    from backends.torch_engine.tp.comm import Comm

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_KV_DTYPES = {
    "f16": torch.float16,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "f32": torch.float32,
}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """ "auto": bf16 on GPUs that have it (else fp16).  On CPU bf16 where the CPU has bf16 matmul (AVX512-BF16 /
    AMX), else float32.  Measured on the 2-core Zen 4 dev machine with the starter model: perplexity 14.91
    (bf16) vs 14.93 (fp32) vs 15.01 (llama.cpp), while a decode step takes 24 ms vs ~137 ms at batch 1 and
    63 vs ~89 ms at batch 16, and a 1922-token prefill 2.5 s vs 5.1 s."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if _cpu_has_bf16() else torch.float32
    if name not in _DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
    return _DTYPES[name]


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


WEIGHT_QUANTS = ("auto", "none", "gguf", "int8", "int4", "fp8", MIXED)


def resolve_weight_quant(name: str, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> str:
    """ "auto": on CPU with bf16 compute, a GGUF keeps its 4-bit projection blocks ("gguf"): the same weights
    llama.cpp runs, read at 4.5-5 bits instead of 16 through torch's packed int4 kernel (a starter-model decode
    step at batch 1 went from ~33 ms to ~16 ms; see kernels/quant_matmul_cpu.py).  Anywhere else dense
    weights ("none"): the plan picks int8/int4/fp8/int4+attn8 for GPUs explicitly, and without bf16 the CPU kernels
    are slower than a dense fp32 matmul."""
    if name not in WEIGHT_QUANTS:
        raise ConfigError(f"the torch engine's weight quantization is one of {', '.join(WEIGHT_QUANTS)}, got {name!r}")
    if name != "auto":
        return name
    return "gguf" if device.type == "cpu" and dtype == torch.bfloat16 and spec.format == "gguf" else "none"


class ModelRunner:
    """ModelRunner(spec, options, kernels=None): loads the weights and allocates the KV pool.

    Attributes: model, device, dtype, kv_dtype, num_blocks, block_size, vocab_size, kv_caches, offload (the
    offload.LayerStreamer when some blocks' weights stream from host RAM, else None).

    Decode-only steps replay CUDA graphs (cuda_graphs.py) where they apply; the decision is made at the first
    decode-only step: `decode_graphs` is then set, or `cuda_graphs_off` says why every step runs eagerly."""

    decode_graphs: DecodeGraphs | None = None
    cuda_graphs_off: str | None = None
    graph_check: dict[str, Any] | None = None  # the first graph step against the eager one (_first_graph_step)
    kernel_check: Any = None  # kernel_check.KernelCheck when the self-check ran (LoadOptions.kernel_check_record)
    kernel_check_error: str | None = None  # why the self-check could not run
    _graphs_decided: bool = False
    weight_cache: str = ""  # the prepared-weight cache's part in this load (cpu_load.CpuLoad.cache); "" = none
    cpu_packed_layers: int = 0
    dense_copy_bytes: int = 0
    thread_tuner: ThreadTuner | None
    offload: LayerStreamer | None
    swapper: KVSwapper | None  # swap space (kv_swap.py): on a GPU whose plan reserved it
    swap_cost: SwapCost | None
    int8_head_bytes: int  # the CPU decode head's int8 copy (cpu_head.py)
    int8_head_off: str | None

    def __init__(
        self, spec: ModelSpec, options: LoadOptions, kernels: str | None = None, tp: Comm | None = None
    ) -> None:
        """tp: this process's place in a tensor-parallel group (backends/torch_engine/tp): the model then keeps
        this rank's share of every layer and the KV pool this rank's KV heads."""
        self.spec, self.options = spec, options
        self.device = resolve_device(options.device)
        # the torch engine's own values, typed and checked (the command line checked them before this process
        # started: backends/engine_options.py); a direct library caller gets the same one-line ConfigError here
        typed = TorchOptions.of(options)
        self.dtype = resolve_dtype(typed.dtype, self.device)
        # On CPU the cache follows the compute dtype: fp16 arithmetic there is slow and converting every
        # gathered block each layer costs more than the memory it saves.
        self.kv_dtype = _KV_DTYPES[typed.kv_cache_type] if self.device.type == "cuda" else self.dtype
        threads = setup_threads(self.device, options, tp)  # loading uses them all
        self.thread_tuner, self._fixed_threads = threads.tuner, threads.fixed
        self.ops = kernel_set(kernels, self.device)
        quant = resolve_weight_quant(typed.weight_quant, spec, self.device, self.dtype)
        # check_model: this module's name for the self-check, the one a test replaces to break it
        loaded = load_runner_model(spec, options, self.device, self.dtype, self.ops, quant, tp, check_model)
        self.model, self.ops, self.offload = loaded.model, loaded.ops, loaded.offload
        self.weight_quant, self.weight_cache = loaded.weight_quant, loaded.weight_cache
        self.dense_copy_bytes, self.cpu_packed_layers = loaded.dense_copy_bytes, loaded.cpu_packed_layers
        self.int8_head_bytes, self.int8_head_off = loaded.int8_head_bytes, loaded.int8_head_off
        self.kernel_check, self.kernel_check_error = loaded.kernel_check, loaded.kernel_check_error
        self._allocate_kv_pool(loaded.kv_heads, loaded.pool_kv_heads)
        self.swapper, self.swap_cost = None, None
        if self.device.type == "cuda" and options.swap_space_bytes > 0 and tp is None:
            self.enable_swap(options.swap_space_bytes // self.kv_pool.block_bytes)
        # the scripted CPU decode loop (scripted_decode.py) where it applies, else why not
        self.scripted_decode_off = "off (tensor parallel)" if tp is not None else install_scripted(self)
        if threads.spare is not None and self.thread_tuner is not None and (free := threads.spare()) is not None:
            self.thread_tuner.start_at(round(free))
        release_load_memory(self.weight_cache)

    def _allocate_kv_pool(self, kv_heads: int, pool_kv_heads: int) -> None:
        """The paged KV pool (kv_pool.py) for `kv_heads` per layer, its block count sized for `pool_kv_heads`
        (a tensor-parallel rank: the most KV heads any rank holds)."""
        self.block_size = BLOCK_SIZE
        self.vocab_size = self.spec.vocab_size
        element_bytes = torch.empty((), dtype=self.kv_dtype).element_size()
        self.num_blocks = kv_pool_blocks(self.spec, self.options, element_bytes, pool_kv_heads)
        self.kv_pool = KVPool(
            self.num_blocks, BLOCK_SIZE, self.spec.n_layers, kv_heads, self.spec.head_dim, self.kv_dtype, self.device
        )
        self.kv_caches = self.kv_pool.caches

    def enable_swap(self, num_host_blocks: int, bytes_per_s: float | None = None) -> None:
        """Keep `num_host_blocks` blocks of swap space in host RAM (pinned when the pool is on a GPU) and
        measure the copy bandwidth (or take `bytes_per_s`: tests swap between two CPU pools with it)."""
        if num_host_blocks < 1:
            return
        store = HostKVStore(self.kv_pool, num_host_blocks, pin=self.device.type == "cuda")
        self.swapper = KVSwapper(self.kv_pool, store)
        self.swap_cost = SwapCost(self.kv_pool.block_bytes, bytes_per_s or measure_bandwidth(self.device))

    def _resident_layers(self, n_gpu_layers: int) -> int:
        """Blocks whose weights live on the device (model_load.resident_layers)."""
        return resident_layers(self.spec.n_layers, self.device, n_gpu_layers)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's weights as held (quantized layers at their packed size; a tied embedding once),
        not counting the dense prefill copies (dense_copy_bytes).  Offloaded blocks count at their host bytes
        (offload_host_bytes in describe()); the GPU then holds weight_bytes - offload_host_bytes plus the
        streaming buffers (offload_buffer_bytes)."""
        seen: set[int] = set()
        total = 0
        for t in list(self.model.parameters()) + [b for b in self.model.buffers() if b is not None]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return (
            total
            + self.int8_head_bytes
            + sum(m._cpu.nbytes for m in self.model.modules() if isinstance(m, QuantLinear) and m._cpu is not None)
        )

    @property
    def kv_cache_bytes(self) -> int:
        """The pool's bytes as reserved: what the plan gave it (kv_committed_bytes: what is in use)."""
        return self.kv_pool.reserved_bytes

    @torch.inference_mode()
    def forward(
        self,
        seqs: list[tuple[Sequence[int], int, Sequence[int]]],
        logit_rows: str | Sequence[bool] = "last",
        num_decodes: int | None = None,
    ) -> torch.Tensor:
        """seqs: (token_ids, start_position, block_table) per sequence.  Returns float32 logits: "last" ->
        (num_seqs, vocab) after each sequence's last token; "all" -> (num_tokens, vocab) after every token; a
        flag per sequence -> every token's row for the flagged ones, the last token's for the others, in order.
        num_decodes: the first so many sequences are one-token decodes and the rest prompt chunks; their rows
        take the quantized and the dense kernels of layers that have both (quantize.QUANTIZED_ROWS).  None:
        each layer chooses by the number of rows."""
        self.kv_pool.ensure(table for _, _, table in seqs)
        ids: list[int] = []
        positions: list[int] = []
        for tokens, start, _ in seqs:
            ids.extend(tokens)
            positions.extend(range(start, start + len(tokens)))
        meta = build_attention_metadata(
            [(start, len(tokens), tuple(table)) for tokens, start, table in seqs], BLOCK_SIZE, self.device
        )
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        token = QUANTIZED_ROWS.set(num_decodes)  # the decodes' rows come first: one row each
        try:
            hidden = self.model(input_ids, pos, self.kv_caches, meta)
            if logit_rows == "last":  # one row per sequence: the decodes' rows still come first
                hidden = hidden.index_select(0, torch.tensor(meta.query_start[1:], device=self.device) - 1)
            elif logit_rows != "all":  # prompt log-probabilities: every row of the flagged sequences
                qs = meta.query_start
                rows = [
                    r
                    for j, flag in enumerate(logit_rows)
                    for r in (range(qs[j], qs[j + 1]) if flag else (qs[j + 1] - 1,))
                ]
                hidden = hidden.index_select(0, torch.tensor(rows, device=self.device))
            return self.model.compute_logits(hidden)
        finally:
            QUANTIZED_ROWS.reset(token)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """All scheduled tokens in one forward; logits (float32) only for requests with needs_logits."""
        t0 = time.perf_counter()
        if out.has_swaps:  # before the forward, which may write into blocks just swapped out
            assert self.swapper is not None, "the scheduler swapped, but this runner has no swap space"
            self.swapper.swap_out(out.swap_out)
            self.swapper.swap_in(out.swap_in)
        if out.is_empty:
            return RunnerOutput((), torch.empty(0, self.vocab_size))
        # decodes first, then speculative rows, then prompt chunks (stable)
        scheduled = sorted(out.scheduled, key=lambda s: (not s.is_decode, not s.num_spec_tokens))
        logits = self._graph_step(scheduled)
        extra = {} if logits is None else {"cuda_graph": True}
        prompt_logits: dict[str, torch.Tensor] = {}
        spec_logits: dict[str, torch.Tensor] = {}
        if logits is None:
            wide = [s.all_logits or s.num_spec_tokens > 0 for s in scheduled]
            num_decodes = sum(s.is_decode for s in scheduled)
            # a speculative row's k + 1 tokens take the decode rows' quantized kernel while the rows stay few:
            # on the dense copies a 5-token row cost ~2x a one-token decode on the starter, on the quantized
            # kernel ~1.1x (scripts/bench_verify_rows.py; docs/performance.md "Speculative decoding")
            spec_rows = sum(s.num_tokens for s in scheduled if s.num_spec_tokens)
            quantized_rows = num_decodes + spec_rows if num_decodes + spec_rows < DENSE_MIN_ROWS else num_decodes
            tuner = self.thread_tuner
            key = num_decodes if tuner is not None and num_decodes == len(scheduled) else None  # decode-only
            head = getattr(self.model, "lm_head", None)
            if quantized_rows and isinstance(head, Int8RowsHead):
                head.packed()  # the first decode step packs the int8 head (cpu_head.py), outside the step's timing
            if tuner is not None:
                tuner.before_step(key)
            t_forward = time.perf_counter()
            logits = self.forward(
                [(s.token_ids, s.start_position, s.block_table) for s in scheduled],
                logit_rows=wide if any(wide) else "last",
                num_decodes=quantized_rows,
            )
            if tuner is not None:
                tuner.after_step(key, time.perf_counter() - t_forward)
            if any(wide):  # split the flagged requests' rows off; one row per request remains
                last, at = [], 0
                for s, flag in zip(scheduled, wide):
                    n = s.num_tokens if flag else 1
                    if s.all_logits:
                        prompt_logits[s.request_id] = logits[at : at + n]
                    elif flag:  # a speculative row: the logits after the last sampled token and each proposal
                        spec_logits[s.request_id] = logits[at : at + n]
                    last.append(at + n - 1)
                    at += n
                logits = logits[last]
        keep = [i for i, s in enumerate(scheduled) if s.needs_logits]
        ids = tuple(scheduled[i].request_id for i in keep)
        rows = logits[keep] if len(keep) != len(scheduled) else logits
        # forward_s is host time: a graph step returns once its work is queued on the GPU
        return RunnerOutput(ids, rows, {"forward_s": time.perf_counter() - t0, **extra}, prompt_logits, spec_logits)

    def _graph_step(self, scheduled: list[ScheduledRequest]) -> torch.Tensor | None:
        """The logits of a decode-only step replayed as a CUDA graph, or None: the step runs eagerly."""
        graphs = self._decode_graphs()
        if graphs is None or not graphs.accepts(scheduled):
            return None
        rows = [(s.token_ids[0], s.start_position, s.block_table) for s in scheduled]
        try:
            if self.graph_check is None and not (self.kernel_check and self.kernel_check.graphs.get("verdict")):
                return self._first_graph_step(graphs, rows)
            return graphs.run(rows)
        except torch.OutOfMemoryError:  # capturing a new size and the graphs' pool could not grow: eager from now
            self.decode_graphs, self.cuda_graphs_off = None, "off (a graph capture ran out of GPU memory)"
            torch.cuda.empty_cache()
            return None

    def _decode_graphs(self) -> DecodeGraphs | None:
        """The CUDA graphs for decode-only steps, set up (buffers only; graphs are captured per batch size as
        steps need them) at the first call, or None when they do not apply (cuda_graphs_off says why)."""
        if not self._graphs_decided:
            self._graphs_decided = True
            self.cuda_graphs_off = unavailable_reason(self.device, self.ops.name, self.model) or self._graphs_vetoed()
            if self.cuda_graphs_off is None:
                max_blocks = min(self.num_blocks, -(-self.options.n_ctx // BLOCK_SIZE))
                self.decode_graphs = DecodeGraphs(
                    self.model, self.kv_caches, self.options.max_num_seqs, max_blocks, BLOCK_SIZE, self.device
                )
        return self.decode_graphs

    def _graphs_vetoed(self) -> str | None:
        """Why the kernel check rules graphs out: a replaced kernel that reads step data on the host, or a
        recorded mismatch of a captured step against the eager one on this device key."""
        blocked = [f for f in self.ops.replaced if f in GRAPH_BLOCKERS]
        if blocked:
            return f"off (the kernel self-check replaced {', '.join(blocked)} by torch ops, which a graph cannot hold)"
        graphs = self.kernel_check.graphs if self.kernel_check is not None else {}
        if graphs.get("verdict") == "mismatch":
            return f"off (on this device a captured decode step differed from the eager one: {graphs.get('detail')})"
        return None

    def _first_graph_step(self, graphs: DecodeGraphs, rows: list[tuple[int, int, Sequence[int]]]) -> torch.Tensor:
        """Issue 25, item 2: the first graph step is also run eagerly (same inputs; the K/V it writes are
        written again by the graph) and their logits compared; a mismatch turns graphs off (and, with a record,
        for this device key) and the eager logits are returned."""
        eager = self.forward([([tok], start, table) for tok, start, table in rows], "last", num_decodes=len(rows))
        got = graphs.run(rows).float()
        err = float((got - eager).abs().max()) if eager.numel() else 0.0
        # logits are sums over the hidden width: the kernel tolerance scaled by the logits' own size
        tol = TOLERANCES.get(self.dtype, 1e-2) * max(1.0, float(eager.abs().max()))
        ok = bool(torch.isfinite(got).all()) and err <= tol
        verdict = {"verdict": "ok" if ok else "mismatch", "max_error": err, "tolerance": tol, "batch": len(rows)}
        if not ok:
            verdict["detail"] = f"max logit error {err:.3g} > {tol:.3g} at batch {len(rows)}"
            self.decode_graphs = None
            self.cuda_graphs_off = (
                f"off (the first captured decode step differed from the eager one: {verdict['detail']})"
            )
        if self.kernel_check is not None:
            self.kernel_check.graphs = verdict
            record_graph_check(self.options.kernel_check_record, self.kernel_check.key, verdict)
        self.graph_check = verdict
        return got if ok else eager

    def prompt_logits(
        self, token_ids: Sequence[int], block_table: Sequence[int] | None = None, chunk: int | None = None
    ) -> torch.Tensor:
        """(len(token_ids), vocab) float32 logits after every position (perplexity).  Runs in chunks of n_batch
        tokens over `block_table`, default blocks 0.. of the pool: only while no request holds blocks."""
        n = len(token_ids)
        need = -(-n // BLOCK_SIZE)
        table = list(block_table) if block_table is not None else list(range(need))
        if len(table) < need:
            raise ConfigError(
                f"{n} tokens need {need} KV blocks but the pool has {self.num_blocks}",
                "load with a larger --ctx or a bigger KV budget",
            )
        chunk = chunk or self.options.n_batch
        parts = [
            self.forward([(token_ids[lo : lo + chunk], lo, table)], "all", num_decodes=0) for lo in range(0, n, chunk)
        ]
        return torch.cat(parts)

    def embed(self, token_ids: Sequence[int], block_table: Sequence[int], pooling: str) -> torch.Tensor:
        """(hidden,) float32: the last hidden states (after the final norm, what llama.cpp's embedding mode pools)
        of `token_ids`, pooled ("mean" | "cls" | "last") and L2-normalized.  Runs in chunks of n_batch tokens
        over `block_table` (blocks the caller allocated), each chunk attending to the ones before it."""
        return self.embed_batch([(token_ids, block_table)], pooling)[0]

    @torch.inference_mode()
    def embed_batch(self, items: Sequence[tuple[Sequence[int], Sequence[int]]], pooling: str) -> list[torch.Tensor]:
        """`embed` of several inputs, (token_ids, block_table) each, packed into few forwards: each forward takes
        the next chunk of every unfinished input, in order, while it holds at most n_batch tokens (the rows of a
        multi-sequence prefill), so an input longer than that spans forwards, each chunk attending to the ones
        before it.  Returns one (hidden,) float32 vector per input, in order."""
        if pooling not in ("mean", "cls", "last"):
            raise ValueError(f"unknown pooling {pooling!r}")
        if any(not ids for ids, _ in items):
            raise ValueError("an input to embed is empty")
        self.kv_pool.ensure(tuple(table) for _, table in items)  # blocks not committed yet are zeroed first
        lengths = [len(ids) for ids, _ in items]
        done = [0] * len(items)
        pooled: list[Any] = [None] * len(items)  # mean: the running sum; cls / last: that row (a copy)
        token = QUANTIZED_ROWS.set(0)  # prompt rows: the dense kernels where a layer has both
        try:
            while rows := _pack_chunks(lengths, done, self.options.n_batch):
                hidden = self._hidden_states([(items[i][0][lo : lo + k], lo, items[i][1]) for i, lo, k in rows])
                at = 0
                for i, lo, k in rows:
                    part = hidden[at : at + k]  # (k, hidden)
                    at, done[i] = at + k, lo + k
                    if pooling == "mean":
                        pooled[i] = part.sum(0) if pooled[i] is None else pooled[i] + part.sum(0)
                    elif pooling == "cls" and lo == 0:
                        pooled[i] = part[0].clone()
                    elif pooling == "last" and done[i] == lengths[i]:
                        pooled[i] = part[-1].clone()
        finally:
            QUANTIZED_ROWS.reset(token)
        vectors = torch.stack([v / n for v, n in zip(pooled, lengths)] if pooling == "mean" else pooled)
        return list(torch.nn.functional.normalize(vectors, dim=1).cpu().unbind(0))

    def _hidden_states(self, seqs: list[tuple[Sequence[int], int, Sequence[int]]]) -> torch.Tensor:
        """(num_tokens, hidden) float32: the model's last hidden states (after the final norm) for the prompt
        chunks `seqs`, (token_ids, start_position, block_table) each, in one forward (their K/V go to the pool)."""
        positions: list[int] = []
        for tokens, start, _ in seqs:
            positions.extend(range(start, start + len(tokens)))
        meta = build_attention_metadata(
            [(start, len(tokens), tuple(table)) for tokens, start, table in seqs], BLOCK_SIZE, self.device
        )
        ids = torch.tensor([t for tokens, _, _ in seqs for t in tokens], dtype=torch.int64, device=self.device)
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        return self.model(ids, pos, self.kv_caches, meta).float()

    def describe(self) -> dict[str, Any]:
        return describe_runner(self)

    def close(self) -> None:
        self.decode_graphs = None  # the graphs write into the KV pool: they go first
        if self.model is not None:
            self.model.scripted_decode = None  # so does the scripted loop (it holds views of the pool)
        self.kv_pool.close()
        self.kv_caches = []
        self.model = None  # type: ignore[assignment]


def _pack_chunks(lengths: Sequence[int], done: Sequence[int], budget: int) -> list[tuple[int, int, int]]:
    """(input, start, count) for the next embedding forward: the next chunk of every unfinished input (`done`
    tokens of `lengths` computed), in order, while the forward holds at most `budget` tokens; [] when all are."""
    rows = []
    for i, (n, lo) in enumerate(zip(lengths, done)):
        take = min(n - lo, budget)
        if take > 0:
            rows.append((i, lo, take))
            budget -= take
        if budget <= 0:
            break
    return rows
