"""The plan's reasons: short sentences with the numbers, and warnings, for `hearth plan` and `run --verbose`."""

from __future__ import annotations

from hwprobe import memory as m
from hwprobe.placement import Candidate
from hwprobe.plan_types import DeviceMemory, Prefs
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.support import torch_engine_refusal


def _gib(mib_value: float) -> str:
    return f"{mib_value / 1024:.1f} GiB"


def reasons(report: HardwareReport, shape: ModelShape, prefs: Prefs, c: Candidate,
            devices: tuple[DeviceMemory, ...], tps: float, quants: list[tuple[str, m.WeightLayout]]) -> tuple[str, ...]:
    out: list[str] = []
    if not report.gpus:
        out.append("no NVIDIA GPU found: the model runs from host RAM")
    for g in report.gpus:
        held = g.memory_total_mib - g.memory_free_mib
        out.append(f"GPU {g.index} {g.name}: {g.memory_free_mib} MiB free of {g.memory_total_mib}"
                   f"{f' ({held} MiB held by other programs)' if held > 512 else ''}; plan budget "
                   f"{m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) // m.MIB} MiB after the safety margin")
    used = [d for d in devices if d.kind == "gpu" and d.used]
    if c.backend == "torch":
        where = "CPU" if not c.gpus else ", ".join(f"GPU {i}" for i in c.gpus)
        why = "the torch engine supports" if torch_engine_refusal(shape) is None else "asked for"
        out.append(f"backend torch: {why} {shape.architecture} and the {c.quant} weights fit entirely on {where}"
                   if c.gpus else f"backend torch on CPU ({c.quant}): "
                   + ("asked for" if prefs.backend == "torch" else "safetensors weights or batching for serve"))
    else:
        if torch_engine_refusal(shape) and report.gpus:
            out.append(f"backend llama.cpp: {torch_engine_refusal(shape)}")
        elif report.gpus and prefs.backend == "auto":
            out.append("backend llama.cpp: the torch engine's formats do not fit entirely in VRAM"
                       " (or the GPU is too old / of unknown compute capability)")
        else:
            out.append("backend llama.cpp" + (" (asked for)" if prefs.backend == "llama.cpp" else " (CPU)"))
    if not shape.quant and c.backend == "llama.cpp" and len(quants) > 1:
        better = [q for q, _ in quants[: [q for q, _ in quants].index(c.quant)]]
        out.append(f"quant {c.quant}: the best of the GGUF ladder that fits"
                   + (f" ({', '.join(better)} do not)" if better else ""))
    if c.quant in m.QUANT_LADDER and m.QUANT_LADDER.index(c.quant) > m.QUANT_LADDER.index(m.LOWEST_DEFAULT_QUANT):
        out.append(f"warning: {c.quant} is below {m.LOWEST_DEFAULT_QUANT}: expect clearly worse quality "
                   "(measure it with `hearth ppl`)")
    if c.gpus:
        layers = "all" if c.n_gpu_layers >= shape.n_layers else str(c.n_gpu_layers)
        out.append(f"{layers} of {shape.n_layers} layers on {'GPUs ' if len(c.gpus) > 1 else 'GPU '}"
                   f"{', '.join(map(str, c.gpus))}" + ("" if c.n_gpu_layers >= shape.n_layers else
                                                       f", {shape.n_layers - c.n_gpu_layers} in host RAM (slower)"))
        if len(c.gpus) > 1:
            out.append(f"split {c.split_mode}: " + ("the GPUs are joined by NVLink/P2P, so each layer is split "
                                                    "across them" if c.split_mode == "tensor" else
                                                    "no P2P between the GPUs, so each holds whole layers"))
    trained = shape.context_length
    asked = "asked for" if prefs.ctx else f"target {min(prefs.target_ctx, trained)}"
    out.append(f"context {c.ctx} tokens ({asked}; trained on {trained})")
    kv_mib = sum(d.kv_mib for d in devices)
    out.append(f"KV cache {c.kv_cache_type}: {_gib(kv_mib)} at {c.ctx} tokens"
               + ("" if c.kv_cache_type == "f16" else " (quantized to fit)" if not prefs.kv_cache_type else ""))
    if shape.n_experts:
        out.append(f"MoE: all {shape.n_experts} experts counted in memory, {shape.n_experts_used} read per token")
    for d in devices:
        if d.used:
            name = "host RAM" if d.kind == "cpu" else f"GPU {d.index}"
            out.append(f"{name}: {_gib(d.total_mib)} of {_gib(d.budget_mib)} (weights {_gib(d.weights_mib)}, KV "
                       f"{_gib(d.kv_mib)}, compute {_gib(d.compute_mib)}, overhead {_gib(d.overhead_mib)}), "
                       f"{_gib(d.headroom_mib)} headroom")
            if d.headroom_mib < 0:
                out.append(f"warning: {name} is over its budget by {-d.headroom_mib} MiB: loading may run out "
                           "of memory (from --n-gpu-layers)")
    if used or not report.gpus or c.gpus == ():
        bw = ", ".join(f"{g.memory_bandwidth_gbps or 'unknown'} GB/s" for g in report.gpus if g.index in c.gpus)
        out.append(f"expected decode ~{tps:.0f} tokens/s from memory bandwidth"
                   + (f" ({bw})" if bw else f" (host RAM {report.ram_bandwidth_gbps:.0f} GB/s)"))
    return tuple(out)
