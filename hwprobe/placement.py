"""Where a candidate configuration puts its bytes: per-device memory and expected decode speed.

The planner (planner.py) proposes candidates; this module prices them with hwprobe.memory, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwprobe import memory as m
from hwprobe.plan_types import DeviceMemory
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape

GPU_BANDWIDTH_EFFICIENCY = 0.75  # decode reaches about this share of peak bandwidth
CPU_BANDWIDTH_EFFICIENCY = 0.6
UNKNOWN_GPU_BANDWIDTH_GBPS = 300.0  # a GPU missing from the known-GPU table
# Per layer and token a GPU also pays kernel launches and syncs (~10 kernels x ~2 us): small models are
# launch-bound, not bandwidth-bound, and without this a 135 M model would "run" at thousands of tokens/s.
GPU_SECONDS_PER_LAYER = 20e-6


@dataclass(frozen=True)
class Candidate:
    backend: str  # "llama.cpp" | "torch"
    quant: str  # label shown in the plan
    layout: m.WeightLayout
    ctx: int
    kv_cache_type: str
    flash_attn: bool
    gpus: tuple[int, ...]  # GPU indices used, in order; () = CPU only
    split_mode: str  # "none" | "layer" | "tensor"
    n_gpu_layers: int
    n_batch: int = 512


def shares(report: HardwareReport, gpus: tuple[int, ...]) -> dict[int, float]:
    """Each used GPU's share of the model: proportional to its budget (free minus margin)."""
    budgets = {g.index: m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) for g in report.gpus
               if g.index in gpus}
    total = sum(budgets.values()) or 1
    return {i: b / total for i, b in budgets.items()}


def _layer_counts(n: int, share: dict[int, float]) -> dict[int, int]:
    """Split n contiguous layers over GPUs by share; the rounding remainder goes to the first GPUs."""
    counts = {i: int(n * s) for i, s in share.items()}
    for i in list(counts)[: n - sum(counts.values())]:
        counts[i] += 1
    return counts


def price(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[DeviceMemory, ...]:
    """Predicted memory of every GPU (index order) and of host RAM for candidate c."""
    lay = c.layout
    kv_total = m.kv_bytes(shape, c.ctx, c.kv_cache_type,
                          swa_full=m.LLAMA_CPP_SWA_FULL if c.backend == "llama.cpp" else False, n_ubatch=c.n_batch)
    kv_per_layer = kv_total / shape.n_layers
    full = c.n_gpu_layers >= shape.n_layers and bool(c.gpus)
    gpu_layer_bytes = sum(lay.layer_bytes[shape.n_layers - c.n_gpu_layers:]) if c.gpus else 0
    share = shares(report, c.gpus)
    main = c.gpus[-1] if c.gpus else None  # llama.cpp puts the head with the last layers
    if c.split_mode == "tensor" and c.gpus:
        main = c.gpus[0]
    gpu_rows: dict[int, tuple[float, float, float, float]] = {}
    counts = _layer_counts(c.n_gpu_layers, share) if c.split_mode != "tensor" else {}
    for i in c.gpus:
        if c.split_mode == "tensor":
            w = gpu_layer_bytes * share[i]
            kv = kv_per_layer * c.n_gpu_layers * share[i]
        else:
            n_here = counts[i]
            start = shape.n_layers - c.n_gpu_layers + sum(counts[j] for j in c.gpus[: c.gpus.index(i)])
            w = sum(lay.layer_bytes[start:start + n_here])
            kv = kv_per_layer * n_here
        head_here = full and (i == main or c.split_mode == "tensor")
        if head_here:
            head_share = share[i] if c.split_mode == "tensor" else 1.0
            tied_in_torch = c.backend == "torch" and lay.tied  # one tensor serves as embedding and head
            w += ((0 if tied_in_torch else lay.head_bytes) + lay.other_bytes) * head_share
        if c.backend == "torch":  # the torch engine keeps the embedding on the GPU too (replicated under TP)
            w += lay.embedding_bytes
        compute = m.compute_bytes(shape, c.ctx, n_ubatch=c.n_batch, flash_attn=c.flash_attn,
                                  with_logits=(i == main))
        overhead = m.TORCH_GPU_OVERHEAD_BYTES if c.backend == "torch" else m.LLAMA_CPP_GPU_OVERHEAD_BYTES
        gpu_rows[i] = (w, kv, compute, overhead)
    devices = []
    for g in report.gpus:
        w, kv, compute, overhead = gpu_rows.get(g.index, (0, 0, 0, 0))
        devices.append(DeviceMemory("gpu", g.index, g.name, m.mib(w), m.mib(kv), m.mib(compute), m.mib(overhead),
                                    m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) // m.MIB))
    cpu_layers = shape.n_layers - (c.n_gpu_layers if c.gpus else 0)
    if c.backend == "torch" and c.gpus:
        cpu_w = cpu_kv = cpu_compute = 0.0
    else:
        cpu_w = sum(lay.layer_bytes[:cpu_layers]) + lay.embedding_bytes
        if not full:
            cpu_w += lay.other_bytes + (0 if lay.tied else lay.head_bytes)
        cpu_kv = kv_per_layer * cpu_layers
        if full:  # only the input and a little glue run on the host
            cpu_compute = 4 * c.n_batch * 2 * shape.hidden_size
        else:
            cpu_compute = m.compute_bytes(shape, c.ctx, n_ubatch=c.n_batch, flash_attn=c.flash_attn)
        cpu_compute += m.output_buffer_bytes(shape)
    devices.append(DeviceMemory("cpu", None, report.cpu_model, m.mib(cpu_w), m.mib(cpu_kv), m.mib(cpu_compute), 0,
                                m.ram_budget_bytes(report.ram_available_mib) // m.MIB))
    return tuple(devices)


def expected_tokens_per_s(report: HardwareReport, shape: ModelShape, c: Candidate,
                          devices: tuple[DeviceMemory, ...]) -> float:
    """Single-stream decode speed: each token reads the weights (active experts only) and the KV cache once.

    Layer split and CPU offload run one device after another (times add up); tensor split runs in parallel
    (the slowest GPU counts)."""
    read_ratio = m.decode_bytes_per_token(c.layout, shape) / max(
        sum(c.layout.layer_bytes) + c.layout.head_bytes, 1)
    times = []
    for d, g in zip(devices, (*report.gpus, None)):
        if not d.used:
            continue
        if g is None:
            bw = report.ram_bandwidth_gbps * CPU_BANDWIDTH_EFFICIENCY
            weights = max(d.weights_mib * m.MIB - c.layout.embedding_bytes, 0)  # one embedding row per token
        else:
            bw = (g.memory_bandwidth_gbps or UNKNOWN_GPU_BANDWIDTH_GBPS) * GPU_BANDWIDTH_EFFICIENCY
            weights = d.weights_mib * m.MIB - (c.layout.embedding_bytes if c.backend == "torch" else 0)
        t = (weights * read_ratio + d.kv_mib * m.MIB) / (bw * 1e9)
        if g is not None:
            t += GPU_SECONDS_PER_LAYER * (c.n_gpu_layers / max(len(c.gpus), 1) if c.split_mode != "tensor"
                                          else c.n_gpu_layers)
        times.append(t)
    if not times:
        return 0.0
    t = max(times) if c.split_mode == "tensor" and len(times) > 1 else sum(times)
    return round(1.0 / t, 1) if t > 0 else 0.0
