"""The model a ModelRunner runs, loaded and made ready: `load_runner_model` returns one LoadedModel.

The steps, in this order (each its own function): read the weights with the loader that fits (mixture of experts:
moe_loader.py; the CPU: cpu_load.py's prepared-weight cache; else loader.py, a tensor-parallel rank reading its
share), cut a MoE model to the rank's share, the Triton kernels' self-check (kernel_check.py), the CPU's packed
projections and int8 decode head (quantize.prepare_for_cpu, cpu_head.py), and the offload of the blocks that
stream from host RAM (offload.py).  Also the CPU threads the load runs with (`setup_threads`) and what the
runner hands back to the OS after it (`release_load_memory`).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
import torch
from torch import nn

from backends.api import LoadOptions
from backends.errors import ModelFormatError
from backends.modelspec import ModelSpec
from backends.quant_config import spec_quant
from backends.thread_tuner import IdleCores, ThreadTuner
from backends.torch_engine.cpu_head import install_int8_head
from backends.torch_engine.cpu_load import CpuLoad, load_for_cpu
from backends.torch_engine.kernel_check import applies, apply_to_model
from backends.torch_engine.offload import LayerStreamer, offload_layers
from backends.torch_engine.quantize import prepare_for_cpu
from backends.torch_engine.tp.layers import pool_kv_heads as most_kv_heads
from backends.torch_engine.tp.layers import shard_model
from hwprobe.memory import torch_cpu_dense_copy_budget
from hwprobe.spare_cores import SpareCores
from kernels.dispatch import KernelSet

if TYPE_CHECKING:  # pragma: no cover
    from backends.torch_engine.tp.comm import Comm


@dataclass(frozen=True)
class LoadedModel:
    """Everything ModelRunner keeps of the load (its attributes of the same names)."""

    model: nn.Module  # on its device, checked, packed, its host blocks streaming (offload)
    ops: KernelSet  # the kernel set after the self-check's swaps
    weight_quant: str  # as loaded: a MoE model asked for "gguf" loads dense ("none"), and describe() says so
    weight_cache: str  # the prepared-weight cache's part in this load (cpu_load.CpuLoad.cache); "" = none
    dense_copy_bytes: int  # bytes of the dense prefill copies (quantize.keep_dense_copy)
    cpu_packed_layers: int  # layers on torch's packed CPU kernels
    kv_heads: int  # the KV heads of this rank's layers: the pool's shape
    pool_kv_heads: int  # the KV heads the pool is sized for (a tensor-parallel rank: the most any rank holds)
    kernel_check: Any  # kernel_check.KernelCheck when the self-check ran, else None
    kernel_check_error: str | None  # why the self-check could not run
    int8_head_bytes: int  # the CPU decode head's int8 copy (cpu_head.py)
    int8_head_off: str | None  # why the int8 head is not installed; None: it is
    offload: LayerStreamer | None  # when some blocks' weights stream from host RAM (resident_layers), else None


@dataclass(frozen=True)
class _ReadModel:
    """The model as its loader returned it, before the kernel check and the CPU preparation."""

    model: nn.Module
    weight_quant: str  # as loaded (LoadedModel.weight_quant)
    cpu: CpuLoad | None  # what the prepared-weight path did (cpu_load.py); None: another loader


@dataclass(frozen=True)
class CpuThreads:
    """The CPU threads of a runner: the tuner that measures each step's count (threads.py), else the fixed one."""

    tuner: ThreadTuner | None
    spare: SpareCores | None  # what other processes leave free while the model loads: the tuner's first count
    fixed: int  # torch's thread count once set up


def setup_threads(device: torch.device, options: LoadOptions, tp: Comm | None) -> CpuThreads:
    """On CPU with adaptive threads (not a tensor-parallel rank) the count each step runs with is measured, not
    fixed (threads.py); loading uses them all.  Else options.n_threads, when given, fixes it.  The fixed count
    is read here, on the engine thread: OpenMP's thread count is per calling thread, and describe() may be
    called from any."""
    tuner: ThreadTuner | None = None
    spare: SpareCores | None = None
    if device.type == "cpu" and options.adaptive_threads and tp is None:
        spare = SpareCores()
        tuner = ThreadTuner(options.n_threads or torch.get_num_threads(), torch.set_num_threads, idle_cores=IdleCores())
    elif options.n_threads and device.type == "cpu":
        torch.set_num_threads(options.n_threads)
    return CpuThreads(tuner, spare, torch.get_num_threads())


def dense_copy_budget() -> int:
    """RAM the CPU path may spend on dense copies of quantized layers for prefill (QuantLinear.keep_dense_copy):
    at most 1 GiB and a tenth of physical memory.  The starter's copies take 212 MiB and make a 512-token
    prefill chunk ~2.5x faster; a 7B model's (13 GiB) do not fit, and it prefills through the int4 kernel.
    The rule is hwprobe.memory's, so the plan counts exactly these copies."""
    return torch_cpu_dense_copy_budget(psutil.virtual_memory().total)


def release_load_memory(weight_cache: str) -> None:
    """After the load: a model mapped from the prepared-weight cache ("hit") has no loader temporaries to
    collect, and a full gc.collect() with torch loaded took 0.07 s of the starter's warm start (RSS after it the
    same, 269 MiB; 37 objects freed): only the heap is trimmed.  Else the freed memory goes back to the OS."""
    if weight_cache == "hit":
        trim_heap()
    else:
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand the loader's freed temporaries (float32 dequantized tensors, repacking copies) back to the OS.
    glibc keeps them in its heap otherwise: the starter's resident memory after loading was 1157 MiB, 915 MiB
    after this."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """malloc_trim(0): glibc returns its heap's free pages to the OS.  Called after each layer's CPU preparation
    too: the float32 temporaries of the dense copies otherwise stay in the heap between the bf16 copies made
    after them, and the load's peak (VmHWM, what the plan must cover) was ~110 MiB above its end state."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim
            pass


def wants_int8_head(device: torch.device, dtype: torch.dtype, ops: KernelSet) -> bool:
    """Whether decode rows take the int8 head (cpu_head.py): the bf16 CPU path on torch's kernels."""
    return device.type == "cpu" and dtype == torch.bfloat16 and ops.name != "reference"


def resident_layers(n_layers: int, device: torch.device, n_gpu_layers: int) -> int:
    """Blocks whose weights live on the device.  On CUDA, 0 < n_gpu_layers < n_layers keeps that many (the
    last ones, as llama.cpp does) and streams the others from pinned host RAM during each forward
    (backends/torch_engine/offload.py); -1, 0 (LoadOptions' default) or >= n_layers keeps every block on
    the GPU: the device already says where the engine computes, and streaming every block (all weights over
    PCIe in every step) is never what a plan asks for.  On CPU every weight is in host RAM anyway."""
    if device.type != "cuda" or n_gpu_layers <= 0:
        return n_layers
    return min(n_gpu_layers, n_layers)


def load_runner_model(
    spec: ModelSpec,
    options: LoadOptions,
    device: torch.device,
    dtype: torch.dtype,
    ops: KernelSet,
    weight_quant: str,
    tp: Comm | None,
    check: Callable[..., Any],
) -> LoadedModel:
    """The model `spec` on `device` in `dtype` through `ops`, its projections as `weight_quant` (resolved:
    model_runner.resolve_weight_quant) and, for `tp`, this rank's share of every layer.  int8 / int4 / fp8 are
    quantized by the loader as it reads each projection (round-to-nearest, the same weights quantize_model
    gives): the dense model is never whole on the device.  `check`: the kernel self-check
    (kernel_check.check_model, passed by ModelRunner under its own module's name)."""
    host_layers = spec.n_layers - resident_layers(spec.n_layers, device, options.n_gpu_layers)
    read = _read_model(spec, options, device, dtype, ops, weight_quant, host_layers, tp)
    model, cpu = read.model, read.cpu
    kv_heads, pool_kv_heads = _shard_kv_heads(spec, model, tp)
    kernel_check, kernel_check_error, ops = check_kernels(spec, model, ops, device, dtype, options, check)
    dense_copy_bytes, packed = (cpu.dense_copy_bytes, cpu.packed_layers) if cpu is not None else (0, 0)
    if device.type == "cpu" and cpu is None:  # not prepared by cpu_load
        dense_copy_bytes, packed = prepare_for_cpu(model, dtype, dense_copy_budget(), trim_heap)
    head_bytes, head_off = 0, "not on a bf16 CPU path"
    if wants_int8_head(device, dtype, ops):
        # its rows come with the prepared weights (cpu_load.py); without the cache they are quantized here
        head_bytes, head_off = install_int8_head(model, cpu.head_rows if cpu is not None else None)
    return LoadedModel(
        model=model,
        ops=ops,
        weight_quant=read.weight_quant,
        weight_cache=cpu.cache if cpu is not None else "",
        dense_copy_bytes=dense_copy_bytes,
        cpu_packed_layers=packed,
        kv_heads=kv_heads,
        pool_kv_heads=pool_kv_heads,
        kernel_check=kernel_check,
        kernel_check_error=kernel_check_error,
        int8_head_bytes=head_bytes,
        int8_head_off=head_off,
        offload=offload_layers(model, spec.n_layers - host_layers, device) if host_layers else None,
    )


def _read_model(
    spec: ModelSpec,
    options: LoadOptions,
    device: torch.device,
    dtype: torch.dtype,
    ops: KernelSet,
    weight_quant: str,
    host_layers: int,
    tp: Comm | None,
) -> _ReadModel:
    """The loader that fits: a mixture of experts (models/moe.py, its first layers' experts maybe in host RAM);
    the CPU through the prepared-weight cache (cpu_load.py); else the dense loader."""
    from backends.torch_engine.loader import load_model  # lazy: heavy: numpy

    checkpoint = spec_quant(spec.path, spec.metadata) if spec.format != "gguf" else None
    if spec.n_experts:
        if checkpoint is not None:
            raise ModelFormatError(
                f"{spec.path} is a {checkpoint.label} mixture of experts, which the torch engine does not run yet",
                "use a GGUF of this model",
            )
        from backends.torch_engine.moe_loader import load_moe_model  # lazy: heavy: numpy

        if weight_quant == "gguf":  # the CPU default; MoE weights load dense, and describe() says so
            weight_quant = "none"

        model = load_moe_model(spec, ops, dtype, device, weight_quant, host_layers, options.cpu_expert_layers)
        return _ReadModel(model, weight_quant, None)
    if device.type == "cpu" and tp is None:
        cpu = load_for_cpu(
            spec,
            ops,
            dtype,
            weight_quant,
            options.n_ctx,
            dense_copy_budget(),
            options.weight_cache_dir,
            trim_heap,
            int8_head=wants_int8_head(device, dtype, ops),
        )
        # a GPTQ / AWQ checkpoint's projections are its own packed weights whatever weight_quant says
        return _ReadModel(cpu.model, checkpoint.label if checkpoint else weight_quant, cpu)
    model = load_model(
        spec,
        ops,
        dtype,
        device,
        weight_quant=weight_quant,
        host_layers=host_layers,
        n_ctx=options.n_ctx,
        tp=tp,  # a rank reads only its share of the file (issue 25: whole models ran ranks out of memory)
    )
    return _ReadModel(model, checkpoint.label if checkpoint else weight_quant, None)


def _shard_kv_heads(spec: ModelSpec, model: nn.Module, tp: Comm | None) -> tuple[int, int]:
    """(this rank's KV heads, the KV heads the pool is sized for).  Runs before the CPU packing, which then packs
    this rank's shares."""
    if tp is None or tp.world <= 1:
        return spec.n_kv_heads, spec.n_kv_heads
    if spec.n_experts:  # the MoE loader reads whole models: cut afterwards (shard_model refuses MoE MLPs)
        return shard_model(model, tp).num_kv_heads, most_kv_heads(spec, tp.world)
    return model.cfg.n_kv_heads, most_kv_heads(spec, tp.world)  # the loader built this rank's share


def check_kernels(
    spec: ModelSpec,
    model: nn.Module,
    ops: KernelSet,
    device: torch.device,
    dtype: torch.dtype,
    options: LoadOptions,
    check: Callable[..., Any],
) -> tuple[Any, str | None, KernelSet]:
    """Issue 25's first contact: check every Triton kernel this model calls on this device (once per device
    key, kept in options.kernel_check_record) and swap the ones that fail, err or are slow for the torch ops.
    A check that itself fails must not take the engine down: the kernels stay, and describe() says why
    unchecked.  Returns (the check or None, why it could not run, the kernel set to run)."""
    record = options.kernel_check_record
    if not record or not applies(ops, device):
        return None, None, ops
    try:
        result = check(spec, model, ops, device, dtype, record)
    except Exception as exc:  # noqa: BLE001 - reported in describe(); the engine runs unchecked
        return None, f"{type(exc).__name__}: {exc}"[:200], ops
    return result, None, apply_to_model(model, ops, result)
