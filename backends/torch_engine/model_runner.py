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

import ctypes
import gc
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psutil
import torch

from backends.api import LoadOptions
from backends.engine_options import TorchOptions
from backends.errors import ConfigError
from backends.modelspec import ModelSpec
from backends.thread_tuner import IdleCores, ThreadTuner
from backends.torch_engine.cpu_head import Int8RowsHead, install_int8_head
from backends.torch_engine.cpu_load import load_for_cpu
from backends.torch_engine.cuda_graphs import DecodeGraphs, graph_sizes, unavailable_reason
from backends.torch_engine.devices import resolve_device
from backends.torch_engine.expert_offload import describe_offloads
from backends.torch_engine.kernel_check import GRAPH_BLOCKERS, applies, apply_to_model, check_model, record_graph_check
from backends.torch_engine.kv_pool import KVPool
from backends.torch_engine.kv_swap import HostKVStore, KVSwapper, measure_bandwidth
from backends.torch_engine.offload import offload_layers
from backends.torch_engine.parts import kv_pool_blocks
from backends.torch_engine.quantize import DENSE_MIN_ROWS, QUANTIZED_ROWS, QuantLinear, prepare_for_cpu
from backends.torch_engine.scripted_decode import describe as describe_scripted
from backends.torch_engine.scripted_decode import install as install_scripted
from backends.torch_engine.seams import BLOCK_SIZE, RunnerOutput, ScheduledRequest, SchedulerOutput
from backends.torch_engine.swap_cost import SwapCost
from backends.torch_engine.tp.layers import pool_kv_heads as most_kv_heads
from backends.torch_engine.tp.layers import shard_model
from hwprobe.memory import torch_cpu_dense_copy_budget
from hwprobe.spare_cores import SpareCores
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


WEIGHT_QUANTS = ("auto", "none", "gguf", "int8", "int4", "fp8")


def resolve_weight_quant(name: str, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> str:
    """ "auto": on CPU with bf16 compute, a GGUF keeps its 4-bit projection blocks ("gguf"): the same weights
    llama.cpp runs, read at 4.5-5 bits instead of 16 through torch's packed int4 kernel (a starter-model decode
    step at batch 1 went from ~33 ms to ~16 ms; see kernels/quant_matmul_cpu.py).  Anywhere else dense
    weights ("none"): the plan picks int8/int4/fp8 for GPUs explicitly, and without bf16 the CPU kernels
    are slower than a dense fp32 matmul."""
    if name not in WEIGHT_QUANTS:
        raise ConfigError(f"the torch engine's weight quantization is one of {', '.join(WEIGHT_QUANTS)}, got {name!r}")
    if name != "auto":
        return name
    return "gguf" if device.type == "cpu" and dtype == torch.bfloat16 and spec.format == "gguf" else "none"


def dense_copy_budget() -> int:
    """RAM the CPU path may spend on dense copies of quantized layers for prefill (QuantLinear.keep_dense_copy):
    at most 1 GiB and a tenth of physical memory.  The starter's copies take 212 MiB and make a 512-token
    prefill chunk ~2.5x faster; a 7B model's (13 GiB) do not fit, and it prefills through the int4 kernel.
    The rule is hwprobe.memory's, so the plan counts exactly these copies."""
    return torch_cpu_dense_copy_budget(psutil.virtual_memory().total)


def _release_freed_memory() -> None:
    """Hand the loader's freed temporaries (float32 dequantized tensors, repacking copies) back to the OS.
    glibc keeps them in its heap otherwise: the starter's resident memory after loading was 1157 MiB, 915 MiB
    after this."""
    gc.collect()
    _trim_heap()


def _trim_heap() -> None:
    """malloc_trim(0): glibc returns its heap's free pages to the OS.  Called after each layer's CPU preparation
    too: the float32 temporaries of the dense copies otherwise stay in the heap between the bf16 copies made
    after them, and the load's peak (VmHWM, what the plan must cover) was ~110 MiB above its end state."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


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

    def __init__(
        self, spec: ModelSpec, options: LoadOptions, kernels: str | None = None, tp: Comm | None = None
    ) -> None:
        """tp: this process's place in a tensor-parallel group (backends/torch_engine/tp): the model then keeps
        this rank's share of every layer and the KV pool this rank's KV heads."""
        from backends.torch_engine.loader import load_model  # lazy: heavy: numpy

        self.spec, self.options = spec, options
        self.device = resolve_device(options.device)
        # the torch engine's own values, typed and checked (the command line checked them before this process
        # started: backends/engine_options.py); a direct library caller gets the same one-line ConfigError here
        typed = TorchOptions.of(options)
        self.dtype = resolve_dtype(typed.dtype, self.device)
        # On CPU the cache follows the compute dtype: fp16 arithmetic there is slow and converting every
        # gathered block each layer costs more than the memory it saves.
        self.kv_dtype = _KV_DTYPES[typed.kv_cache_type] if self.device.type == "cuda" else self.dtype
        self.thread_tuner: ThreadTuner | None = None
        spare: SpareCores | None = None
        if self.device.type == "cpu" and options.adaptive_threads and tp is None:
            spare = SpareCores()  # what other processes leave free while this loads: the tuner's first count
            # the count each step runs with is measured, not fixed (threads.py); loading uses them all
            self.thread_tuner = ThreadTuner(
                options.n_threads or torch.get_num_threads(), torch.set_num_threads, idle_cores=IdleCores()
            )
        elif options.n_threads and self.device.type == "cpu":
            torch.set_num_threads(options.n_threads)
        # read here, on the engine thread: OpenMP's thread count is per calling thread, and describe() may be
        # called from any
        self._fixed_threads = torch.get_num_threads()
        self.ops = kernel_set(kernels, self.device)
        self.weight_quant = resolve_weight_quant(typed.weight_quant, spec, self.device, self.dtype)
        # int8 / int4 / fp8 are quantized by the loader as it reads each projection (round-to-nearest, the
        # same weights quantize_model gives): the dense model is never whole on the device.
        host_layers = spec.n_layers - self._resident_layers(options.n_gpu_layers)
        head_rows = None  # the int8 decode head's rows from the prepared-weight cache (cpu_load.py)
        if spec.n_experts:  # mixture of experts: models/moe.py, its first layers' experts maybe in host RAM
            from backends.torch_engine.moe_loader import load_moe_model  # lazy: heavy: numpy

            if self.weight_quant == "gguf":  # the CPU default; MoE weights load dense, and describe() says so
                self.weight_quant = "none"

            self.model = load_moe_model(
                spec, self.ops, self.dtype, self.device, self.weight_quant, host_layers, options.cpu_expert_layers
            )
        elif self.device.type == "cpu" and tp is None:  # through the prepared-weight cache (cpu_load.py)
            loaded = load_for_cpu(
                spec,
                self.ops,
                self.dtype,
                self.weight_quant,
                options.n_ctx,
                dense_copy_budget(),
                options.weight_cache_dir,
                _trim_heap,
                int8_head=self._wants_int8_head(),
            )
            self.model, self.weight_cache, head_rows = loaded.model, loaded.cache, loaded.head_rows
            self.dense_copy_bytes, self.cpu_packed_layers = loaded.dense_copy_bytes, loaded.packed_layers
        else:
            self.model = load_model(
                spec,
                self.ops,
                self.dtype,
                self.device,
                weight_quant=self.weight_quant,
                host_layers=host_layers,
                n_ctx=options.n_ctx,
                tp=tp,  # a rank reads only its share of the file (issue 25: whole models ran ranks out of memory)
            )
        kv_heads = pool_kv_heads = spec.n_kv_heads
        if tp is not None and tp.world > 1:  # before the CPU packing below, which then packs this rank's shares
            pool_kv_heads = most_kv_heads(spec, tp.world)
            if spec.n_experts:  # the MoE loader reads whole models: cut afterwards (shard_model refuses MoE MLPs)
                kv_heads = shard_model(self.model, tp).num_kv_heads
            else:
                kv_heads = self.model.cfg.n_kv_heads  # the loader built this rank's share
        self.kernel_check, self.kernel_check_error = self._check_kernels(options.kernel_check_record)
        self.int8_head_bytes = 0  # the CPU decode head's int8 copy (cpu_head.py)
        self.int8_head_off: str | None = "not on a bf16 CPU path"
        if self.device.type == "cpu" and self.weight_cache == "":  # not prepared by cpu_load above
            self.dense_copy_bytes, self.cpu_packed_layers = prepare_for_cpu(
                self.model, self.dtype, dense_copy_budget(), _trim_heap
            )
        if self._wants_int8_head():
            # its rows come with the prepared weights (cpu_load.py); without the cache they are quantized here
            self.int8_head_bytes, self.int8_head_off = install_int8_head(self.model, head_rows)
        self.offload = self._build_offload(options.n_gpu_layers)
        self.block_size = BLOCK_SIZE
        self.vocab_size = spec.vocab_size
        self.num_blocks = kv_pool_blocks(
            spec, options, torch.empty((), dtype=self.kv_dtype).element_size(), pool_kv_heads
        )
        self.kv_pool = KVPool(
            self.num_blocks, BLOCK_SIZE, spec.n_layers, kv_heads, spec.head_dim, self.kv_dtype, self.device
        )
        self.kv_caches = self.kv_pool.caches
        self.swapper: KVSwapper | None = None  # swap space (kv_swap.py): on a GPU whose plan reserved it
        self.swap_cost: SwapCost | None = None
        if self.device.type == "cuda" and options.swap_space_bytes > 0 and tp is None:
            self.enable_swap(options.swap_space_bytes // self.kv_pool.block_bytes)
        # the scripted CPU decode loop (scripted_decode.py) where it applies, else why not
        self.scripted_decode_off = "off (tensor parallel)" if tp is not None else install_scripted(self)
        if spare is not None and self.thread_tuner is not None and (free := spare()) is not None:
            self.thread_tuner.start_at(round(free))
        if self.weight_cache == "hit":
            # mapped from the cache: no loader temporaries to collect, and a full gc.collect() with torch loaded
            # took 0.07 s of the starter's warm start (RSS after it the same, 269 MiB; 37 objects freed)
            _trim_heap()
        else:
            _release_freed_memory()

    def _wants_int8_head(self) -> bool:
        """Whether decode rows take the int8 head (cpu_head.py): the bf16 CPU path on torch's kernels."""
        return self.device.type == "cpu" and self.dtype == torch.bfloat16 and self.ops.name != "reference"

    def _int8_head_off(self) -> str | None:
        head = getattr(self.model, "lm_head", None)
        return head.off if isinstance(head, Int8RowsHead) and head.off else self.int8_head_off

    def enable_swap(self, num_host_blocks: int, bytes_per_s: float | None = None) -> None:
        """Keep `num_host_blocks` blocks of swap space in host RAM (pinned when the pool is on a GPU) and
        measure the copy bandwidth (or take `bytes_per_s`: tests swap between two CPU pools with it)."""
        if num_host_blocks < 1:
            return
        store = HostKVStore(self.kv_pool, num_host_blocks, pin=self.device.type == "cuda")
        self.swapper = KVSwapper(self.kv_pool, store)
        self.swap_cost = SwapCost(self.kv_pool.block_bytes, bytes_per_s or measure_bandwidth(self.device))

    def _check_kernels(self, record: str | None) -> tuple[Any, str | None]:
        """Issue 25's first contact: check every Triton kernel this model calls on this device (once per device
        key, kept in `record`) and swap the ones that fail, err or are slow for the torch ops.  A check that
        itself fails must not take the engine down: the kernels stay, and describe() says why unchecked."""
        if not record or not applies(self.ops, self.device):
            return None, None
        try:
            check = check_model(self.spec, self.model, self.ops, self.device, self.dtype, record)
        except Exception as exc:  # noqa: BLE001 - reported in describe(); the engine runs unchecked
            return None, f"{type(exc).__name__}: {exc}"[:200]
        self.ops = apply_to_model(self.model, self.ops, check)
        return check, None

    def _resident_layers(self, n_gpu_layers: int) -> int:
        """Blocks whose weights live on the device.  On CUDA, 0 < n_gpu_layers < n_layers keeps that many (the
        last ones, as llama.cpp does) and streams the others from pinned host RAM during each forward
        (backends/torch_engine/offload.py); -1, 0 (LoadOptions' default) or >= n_layers keeps every block on
        the GPU: the device already says where the engine computes, and streaming every block (all weights over
        PCIe in every step) is never what a plan asks for.  On CPU every weight is in host RAM anyway."""
        n = self.spec.n_layers
        if self.device.type != "cuda" or n_gpu_layers <= 0:
            return n
        return min(n_gpu_layers, n)

    def _build_offload(self, n_gpu_layers: int):
        """The offload.LayerStreamer when some blocks stream from host RAM (see _resident_layers), else None."""
        resident = self._resident_layers(n_gpu_layers)
        if resident == self.spec.n_layers:
            return None

        return offload_layers(self.model, resident, self.device)

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

    @torch.inference_mode()
    def embed(self, token_ids: Sequence[int], block_table: Sequence[int], pooling: str) -> torch.Tensor:
        """(hidden,) float32: the last hidden states (after the final norm, what llama.cpp's embedding mode pools)
        of `token_ids`, pooled ("mean" | "cls" | "last") and L2-normalized.  Runs in chunks of n_batch tokens
        over `block_table` (blocks the caller allocated), each chunk attending to the ones before it."""
        n, chunk = len(token_ids), self.options.n_batch
        self.kv_pool.ensure([tuple(block_table)])  # blocks a growing pool has not committed yet are zeroed first
        total: torch.Tensor | None = None
        first = last = None
        token = QUANTIZED_ROWS.set(0)  # prompt rows: the dense kernels where a layer has both
        try:
            for lo in range(0, n, chunk):
                part = list(token_ids[lo : lo + chunk])
                meta = build_attention_metadata([(lo, len(part), tuple(block_table))], BLOCK_SIZE, self.device)
                ids = torch.tensor(part, dtype=torch.int64, device=self.device)
                pos = torch.arange(lo, lo + len(part), dtype=torch.int64, device=self.device)
                hidden = self.model(ids, pos, self.kv_caches, meta).float()  # (len(part), hidden)
                total = hidden.sum(0) if total is None else total + hidden.sum(0)
                first = hidden[0] if first is None else first
                last = hidden[-1]
        finally:
            QUANTIZED_ROWS.reset(token)
        assert total is not None and first is not None and last is not None
        vector = {"mean": total / n, "cls": first, "last": last}[pooling]
        return torch.nn.functional.normalize(vector, dim=0).cpu()

    def describe(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_dtype": str(self.kv_dtype).removeprefix("torch."),
            "kv_blocks": self.num_blocks,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_committed_bytes": self.kv_pool.committed_bytes,
            "swap_space_bytes": self.swapper.store.nbytes if self.swapper is not None else 0,
            "swap_gb_per_s": round(self.swap_cost.bytes_per_s / 1e9, 2) if self.swap_cost is not None else 0,
            "kernels": self.ops.name,
            "weight_quant": self.weight_quant,
            "weight_bytes": self.weight_bytes,
            "cpu_packed_layers": self.cpu_packed_layers,
            "dense_copy_bytes": self.dense_copy_bytes,
            **({"weight_cache": self.weight_cache} if self.weight_cache else {}),
            "int8_head": "on" if self._int8_head_off() is None else f"off ({self._int8_head_off()})",
            "tensor_parallel": 1,
            **self._describe_threads(),
            **self._describe_offload(),
            **self._describe_experts(),
            **self._describe_graphs(),
            **describe_scripted(self.model, self.device, self.scripted_decode_off),
            **self._describe_kernel_check(),
        }

    def _describe_threads(self) -> dict[str, Any]:
        if self.device.type != "cpu":
            return {}
        tuner = self.thread_tuner
        if tuner is None:
            return {"cpu_threads": self._fixed_threads, "cpu_threads_policy": "fixed"}
        return tuner.describe()

    def _describe_kernel_check(self) -> dict[str, Any]:
        if self.kernel_check_error is not None:
            return {"kernel_check": f"could not run ({self.kernel_check_error})"}
        if self.kernel_check is None:
            return {}
        return {**self.kernel_check.describe(), "kernel_check_reasons": tuple(self.kernel_check.reasons())}

    def _describe_experts(self) -> dict[str, Any]:
        if not self.spec.n_experts:
            return {}

        return describe_offloads(self.model)

    def _describe_graphs(self) -> dict[str, Any]:
        """Safe from other threads: reads the decision, or predicts it without allocating anything."""
        graphs = self.decode_graphs
        if graphs is not None:
            return {"cuda_graphs": "on", **graphs.describe()}
        off = (
            self.cuda_graphs_off if self._graphs_decided else unavailable_reason(self.device, self.ops.name, self.model)
        )
        if off is None:  # not set up yet: the sizes it will capture as steps need them
            return {
                "cuda_graphs": "on",
                "cuda_graph_sizes": graph_sizes(self.options.max_num_seqs),
                "cuda_graphs_captured": (),
            }
        return {"cuda_graphs": off}

    def _describe_offload(self) -> dict[str, Any]:
        streamer = self.offload
        if streamer is None:
            return {"offloaded_layers": 0, "offload_host_bytes": 0, "offload_buffer_bytes": 0}
        return {
            "offloaded_layers": len(streamer.offloaded),
            "offload_host_bytes": streamer.host_bytes,
            "offload_buffer_bytes": streamer.buffer_bytes,
        }

    def close(self) -> None:
        self.decode_graphs = None  # the graphs write into the KV pool: they go first
        if self.model is not None:
            self.model.scripted_decode = None  # so does the scripted loop (it holds views of the pool)
        self.kv_pool.close()
        self.kv_caches = []
        self.model = None  # type: ignore[assignment]
