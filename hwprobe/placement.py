"""Where a candidate configuration puts its bytes: per-device memory and expected decode speed.

The planner (planner.py) proposes candidates; this module prices them with hwprobe.memory, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hwprobe import memory as m
from hwprobe.bandwidth import (
    CPU_BANDWIDTH_EFFICIENCY,
    GPU_SECONDS_PER_LAYER,
    UNKNOWN_GPU_BANDWIDTH_GBPS,
)
from hwprobe.decode_speed import Efficiency, efficiency, mixed_share
from hwprobe.experts import expert_tokens_per_s, with_host_experts
from hwprobe.plan_types import DeviceMemory
from hwprobe.report import GpuInfo, HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.tensor_parallel import tp_kv_heads


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
    max_num_seqs: int = 1  # torch engine: full-context sequences its KV pool may hold at most
    # llama.cpp with every layer on one GPU: the first so many blocks' routed experts stay in host RAM
    # (hwprobe.experts; tensor buffer overrides)
    cpu_expert_layers: int = 0


def shares(report: HardwareReport, gpus: tuple[int, ...]) -> dict[int, float]:
    """Each used GPU's share of the model: proportional to its budget (free minus margin)."""
    budgets = {
        g.index: m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) for g in report.gpus if g.index in gpus
    }
    total = sum(budgets.values()) or 1
    return {i: b / total for i, b in budgets.items()}


def _layer_counts(n: int, share: dict[int, float]) -> dict[int, int]:
    """Split n contiguous layers over GPUs by share; the rounding remainder goes to the first GPUs."""
    counts = {i: int(n * s) for i, s in share.items()}
    for i in list(counts)[: n - sum(counts.values())]:
        counts[i] += 1
    return counts


def is_torch_offload(shape: ModelShape, c: Candidate) -> bool:
    """c is the torch engine on a GPU with its first n_layers - n_gpu_layers blocks streamed from host RAM."""
    return c.backend == "torch" and bool(c.gpus) and 0 < c.n_gpu_layers < shape.n_layers


def price(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[DeviceMemory, ...]:
    """Predicted memory of every GPU (index order) and of host RAM for candidate c."""
    if is_torch_offload(shape, c):
        return _with_kv_pool(shape, c, _price_torch_offload(report, shape, c))
    if c.cpu_expert_layers:
        devices = with_host_experts(shape, c.layout, c.cpu_expert_layers, c.n_batch, _price(report, shape, c))
        return _with_kv_pool(shape, c, devices)
    return _with_kv_pool(shape, c, _price(report, shape, c))


def _with_kv_pool(shape: ModelShape, c: Candidate, devices: tuple[DeviceMemory, ...]) -> tuple[DeviceMemory, ...]:
    """Set each device's kv_pool_tokens; for the torch engine, make its KV the pool it will allocate: what is
    left of the device's budget after weights, compute buffers and overhead, capped at c.max_num_seqs sequences
    of c.ctx tokens, never below one (memory.torch_kv_pool_bytes: a candidate whose one sequence does not fit
    is over budget).  The engine runs on one device: c.gpus[0], else the CPU."""
    if c.backend != "torch":
        return tuple(replace(d, kv_pool_tokens=c.ctx) if d.kv_mib else d for d in devices)
    if c.split_mode == "tensor" and len(c.gpus) > 1:
        return _tp_kv_pool(shape, c, devices)
    at = next(i for i, d in enumerate(devices) if (d.index == c.gpus[0] if c.gpus else d.kind == "cpu"))
    d = devices[at]
    free = (d.budget_mib - d.weights_mib - d.compute_mib - d.overhead_mib) * m.MIB
    pool = m.torch_kv_pool_bytes(shape, c.ctx, c.kv_cache_type, c.max_num_seqs, free)
    tokens = pool // m.kv_bytes_per_token(shape, c.kv_cache_type)
    return devices[:at] + (replace(d, kv_mib=m.mib(pool), kv_pool_tokens=tokens),) + devices[at + 1 :]


def _tp_kv_pool(shape: ModelShape, c: Candidate, devices: tuple[DeviceMemory, ...]) -> tuple[DeviceMemory, ...]:
    """Tensor parallelism: one pool of T tokens, every rank holding T tokens of its own KV heads
    (hwprobe.tensor_parallel); T is what the tightest device leaves for the busiest rank's share."""
    heads = dict(zip(c.gpus, tp_kv_heads(shape.n_heads, shape.n_kv_heads, len(c.gpus))))
    busiest = max(heads.values()) / shape.n_kv_heads
    used = [d for d in devices if d.kind == "gpu" and d.index in heads]
    free = min((d.budget_mib - d.weights_mib - d.compute_mib - d.overhead_mib) * m.MIB for d in used)
    pool = m.torch_kv_pool_bytes(shape, c.ctx, c.kv_cache_type, c.max_num_seqs, int(free / busiest))
    tokens = pool // m.kv_bytes_per_token(shape, c.kv_cache_type)
    return tuple(
        replace(d, kv_mib=m.mib(pool * heads[d.index] / shape.n_kv_heads), kv_pool_tokens=tokens)
        if d.kind == "gpu" and d.index in heads
        else d
        for d in devices
    )


def _price(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[DeviceMemory, ...]:
    """price() of everything but the torch engine streaming blocks; the torch engine's KV is one sequence here
    (_with_kv_pool sizes its pool)."""
    kv_total = m.kv_bytes(
        shape,
        c.ctx,
        c.kv_cache_type,
        swa_full=m.LLAMA_CPP_SWA_FULL if c.backend == "llama.cpp" else False,
        n_ubatch=c.n_batch,
    )
    kv_per_layer = kv_total / shape.n_layers
    full = c.n_gpu_layers >= shape.n_layers and bool(c.gpus)
    gpu_rows = _gpu_rows(report, shape, c, kv_per_layer, full)
    devices = [_gpu_memory(g, *gpu_rows.get(g.index, (0, 0, 0, 0))) for g in report.gpus]
    devices.append(_host_memory(report, shape, c, kv_per_layer, full))
    return tuple(devices)


def _gpu_rows(
    report: HardwareReport, shape: ModelShape, c: Candidate, kv_per_layer: float, full: bool
) -> dict[int, tuple[float, float, float, float]]:
    """(weights, KV, compute, overhead) bytes of each GPU of c: its share of the layers (contiguous ones in a
    layer split, a slice of every one in a tensor split), and the head where it runs."""
    lay = c.layout
    gpu_layer_bytes = sum(lay.layer_bytes[shape.n_layers - c.n_gpu_layers :]) if c.gpus else 0
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
            w = sum(lay.layer_bytes[start : start + n_here])
            kv = kv_per_layer * n_here
        head_here = full and (i == main or c.split_mode == "tensor")
        if head_here:
            head_share = share[i] if c.split_mode == "tensor" else 1.0
            tied_in_torch = c.backend == "torch" and lay.tied  # one tensor serves as embedding and head
            w += ((0 if tied_in_torch else lay.head_bytes) + lay.other_bytes) * head_share
        if c.backend == "torch":  # the torch engine keeps the embedding on the GPU too (replicated under TP)
            w += lay.embedding_bytes
        compute = m.compute_bytes(shape, c.ctx, n_ubatch=c.n_batch, flash_attn=c.flash_attn, with_logits=(i == main))
        overhead = m.TORCH_GPU_OVERHEAD_BYTES if c.backend == "torch" else m.LLAMA_CPP_GPU_OVERHEAD_BYTES
        gpu_rows[i] = (w, kv, compute, overhead)
    return gpu_rows


def _gpu_memory(g: GpuInfo, w: float, kv: float, compute: float, overhead: float) -> DeviceMemory:
    """GPU g's row of a pricing from its bytes, against its budget."""
    return DeviceMemory(
        "gpu",
        g.index,
        g.name,
        m.mib(w),
        m.mib(kv),
        m.mib(compute),
        m.mib(overhead),
        m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) // m.MIB,
    )


def _host_memory(
    report: HardwareReport, shape: ModelShape, c: Candidate, kv_per_layer: float, full: bool
) -> DeviceMemory:
    """Host RAM's row of _price: the layers (and their KV) not on the GPUs, the embedding, the head where no GPU
    has it; for the torch engine on a GPU, nothing."""
    lay = c.layout
    cpu_layers = shape.n_layers - (c.n_gpu_layers if c.gpus else 0)
    cpu_overhead = 0.0
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
        if c.backend == "torch":  # on the CPU: its dense prefill copies, gathered KV, and its tokenizer
            cpu_w += lay.prefill_copy_bytes
            cpu_compute += m.torch_cpu_attention_bytes(shape, c.ctx, c.max_num_seqs, c.kv_cache_type)
            cpu_overhead = m.torch_tokenizer_bytes(shape)
    return DeviceMemory(
        "cpu",
        None,
        report.cpu_model,
        m.mib(cpu_w),
        m.mib(cpu_kv),
        m.mib(cpu_compute),
        m.mib(cpu_overhead),
        m.ram_budget_bytes(report.ram_available_mib) // m.MIB,
    )


def _price_torch_offload(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[DeviceMemory, ...]:
    """The torch engine streaming blocks (backends/torch_engine/offload.py) on c.gpus[0] (one GPU: no tensor
    parallelism).  Unlike llama.cpp's partial offload, where the CPU layers' KV cache is in host RAM, every
    layer's KV cache stays on the GPU (the streamed blocks compute there), and so do the embedding, final norm
    and head; the streamed blocks need min(TORCH_OFFLOAD_BUFFERS, streamed) device buffers, each the size of
    the largest of them.  Host RAM holds the streamed blocks' weights, pinned, and nothing else of the model."""
    lay = c.layout
    streamed = shape.n_layers - c.n_gpu_layers
    host_blocks = lay.layer_bytes[:streamed]
    weights = (
        sum(lay.layer_bytes[streamed:])
        + lay.embedding_bytes
        + (0 if lay.tied else lay.head_bytes)
        + lay.other_bytes
        + m.offload_buffer_bytes(host_blocks, TORCH_OFFLOAD_BUFFERS)
    )
    kv = m.kv_bytes(shape, c.ctx, c.kv_cache_type, swa_full=False, n_ubatch=c.n_batch)
    compute = m.compute_bytes(shape, c.ctx, n_ubatch=c.n_batch, flash_attn=c.flash_attn, with_logits=True)
    devices = []
    for g in report.gpus:
        here = g.index == c.gpus[0]
        devices.append(
            DeviceMemory(
                "gpu",
                g.index,
                g.name,
                m.mib(weights) if here else 0,
                m.mib(kv) if here else 0,
                m.mib(compute) if here else 0,
                m.mib(m.TORCH_GPU_OVERHEAD_BYTES) if here else 0,
                m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) // m.MIB,
            )
        )
    devices.append(
        DeviceMemory(
            "cpu",
            None,
            report.cpu_model,
            m.mib(sum(host_blocks)),
            0,
            0,
            0,
            m.ram_budget_bytes(report.ram_available_mib) // m.MIB,
        )
    )
    return tuple(devices)


# the kind of weights each torch format's projections are (hwprobe.decode_speed kinds): for the measured
# efficiencies here, and for the decode records `hearth bench` keeps (app/measurements.py); W4A16+attn8 holds two
# kinds, so it has no entry (decode_efficiency mixes them; no record of one kernel's speed is kept from it)
TORCH_KIND = {"bf16": "16bit", "fp16": "16bit", "fp32": "16bit", "W8A16": "int8", "FP8": "fp8", "W4A16": "int4"}


def decode_efficiency(shape: ModelShape, c: Candidate, gpu: GpuInfo) -> Efficiency:
    """The measured share of `gpu`'s bandwidth candidate c's decode reaches there (hwprobe.decode_speed): llama.cpp's
    kernels as one figure; the torch engine's by the bytes of each kind its format holds (the projections in the
    format's kind, the rest 16-bit; the GGUF layout's int4 and int8 blocks, and W4A16+attn8's int8 attention and
    int4 MLP, each at their own kernel's share; the GGUF layout's q6 blocks and quantized head too)."""
    records, cc = gpu.decode_records, gpu.cc
    if c.backend != "torch":
        return efficiency("llama.cpp", "ggml", cc, records)
    sixteen = efficiency("torch", "16bit", cc, records)
    total = sum(c.layout.layer_bytes) + c.layout.head_bytes + c.layout.other_bytes
    if c.quant == m.TORCH_GGUF:
        kinds = m.torch_gguf_kind_bytes(shape)  # the blocks and a quantized head, each at its own kernel's share
        parts = [(b, efficiency("torch", kind, cc, records)) for kind, b in kinds.items()]
        return mixed_share([*parts, (max(total - sum(kinds.values()), 0), sixteen)])
    if c.quant == m.TORCH_MIXED:
        attention, mlp = (b * shape.n_layers for b in m.torch_mixed_bytes(shape))
        parts = [(attention, efficiency("torch", "int8", cc, records)), (mlp, efficiency("torch", "int4", cc, records))]
        return mixed_share([*parts, (max(total - attention - mlp, 0), sixteen)])
    cq = m.checkpoint_quant(shape)
    kind = f"int{cq['bits']}" if cq and c.quant == cq["label"] else TORCH_KIND.get(c.quant, "16bit")
    if kind == "16bit":
        return sixteen
    quantized = sum(c.layout.layer_bytes)
    return mixed_share([(quantized, efficiency("torch", kind, cc, records)), (total - quantized, sixteen)])


def expected_tokens_per_s(
    report: HardwareReport, shape: ModelShape, c: Candidate, devices: tuple[DeviceMemory, ...]
) -> float:
    """Single-stream decode speed: each token reads the weights (active experts only) and the KV cache once.

    Layer split and CPU offload run one device after another (times add up); tensor split runs in parallel
    (the slowest GPU counts).  The torch engine streaming blocks over PCIe: torch_offload_tokens_per_s."""
    if is_torch_offload(shape, c):
        return torch_offload_tokens_per_s(report, shape, c)
    if c.cpu_expert_layers and c.gpus:
        kv = m.kv_bytes(shape, c.ctx, c.kv_cache_type, swa_full=m.LLAMA_CPP_SWA_FULL, n_ubatch=c.n_batch)
        return expert_tokens_per_s(report, shape, c.layout, c.gpus[0], c.cpu_expert_layers, kv)
    read_ratio = m.decode_bytes_per_token(c.layout, shape) / max(sum(c.layout.layer_bytes) + c.layout.head_bytes, 1)
    times = []
    for d, g in zip(devices, (*report.gpus, None)):
        if not d.used:
            continue
        if g is None:
            bw = report.ram_bandwidth_gbps * CPU_BANDWIDTH_EFFICIENCY
            # one embedding row per token; the torch engine's dense prefill copies are not read by a decode
            weights = max(d.weights_mib * m.MIB - c.layout.embedding_bytes - c.layout.prefill_copy_bytes, 0)
        else:
            bw = (g.memory_bandwidth_gbps or UNKNOWN_GPU_BANDWIDTH_GBPS) * decode_efficiency(shape, c, g).share
            weights = d.weights_mib * m.MIB - (c.layout.embedding_bytes if c.backend == "torch" else 0)
        # a single stream reads its own sequence's KV, not the torch engine's whole pool
        kv = d.kv_mib * m.MIB * (min(c.ctx / d.kv_pool_tokens, 1.0) if d.kv_pool_tokens else 1.0)
        t = (weights * read_ratio + kv) / (bw * 1e9)
        if g is not None:
            t += GPU_SECONDS_PER_LAYER * (
                c.n_gpu_layers / max(len(c.gpus), 1) if c.split_mode != "tensor" else c.n_gpu_layers
            )
        times.append(t)
    if not times:
        return 0.0
    t = max(times) if c.split_mode == "tensor" and len(times) > 1 else sum(times)
    return round(1.0 / t, 1) if t > 0 else 0.0


# ---- the torch engine streaming offloaded blocks over PCIe (backends/torch_engine/offload.py) -----------------

# GB/s per lane and direction after line encoding (8b/10b up to 2.0, 128b/130b from 3.0, FLIT at 6.0)
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# pinned host-to-device copies reach about this share of the link: ~25 GB/s on 4.0 x16 (31.5), ~12.6 on 3.0 x16
PCIE_EFFICIENCY = 0.8
DEFAULT_PCIE_GENERATION, DEFAULT_PCIE_WIDTH = 4, 16  # a report that lacks the link
TORCH_OFFLOAD_BUFFERS = 2  # backends/torch_engine/offload.py NUM_BUFFERS: only blocks beyond this many stream


def pcie_link(gpu: GpuInfo | None) -> tuple[int, int]:
    """(generation, lanes) a copy to `gpu` gets: from the report, else PCIe 4.0 x16.  NVML reports the *current*
    link, and an idle GPU drops it to generation 1 to save power (it returns to the maximum under load), so a
    generation below 3 counts as unknown rather than as the link a copy gets: no GPU that runs these models has
    a lower maximum.  A generation newer than PCIE_LANE_GBPS counts as the newest it knows."""
    gen = gpu.pcie_generation if gpu is not None else None
    if gen is None or gen < 3:
        gen = DEFAULT_PCIE_GENERATION
    width = (gpu.pcie_width if gpu is not None else None) or DEFAULT_PCIE_WIDTH
    return min(gen, max(PCIE_LANE_GBPS)), width


def pcie_gbps(gpu: GpuInfo | None) -> float:
    """Effective host-to-device GB/s of `gpu`'s PCIe link (pcie_link): ~25 GB/s on PCIe 4.0 x16."""
    gen, width = pcie_link(gpu)
    return PCIE_LANE_GBPS[gen] * width * PCIE_EFFICIENCY


def torch_offload_tokens_per_s(report: HardwareReport, shape: ModelShape, c: Candidate) -> float:
    """Single-stream decode speed of the torch engine keeping the last c.n_gpu_layers blocks on c.gpus[0] and
    streaming the first n_layers - c.n_gpu_layers from pinned host RAM every step.

    Assumed (each block j's compute time t_c and copy time t_x):
    - t_c as in expected_tokens_per_s: the block's weights (active experts only) and its KV cache at full
      context read at GPU bandwidth x the format's measured share (decode_efficiency), plus
      GPU_SECONDS_PER_LAYER of launches;
    - t_x: the whole block (every expert: which ones are routed is known only after the router ran) at
      pcie_gbps(gpu), or at the host's RAM bandwidth if that is lower;
    - double buffering: block j+1 crosses while block j computes, so each pair costs max(t_x(j+1), t_c(j)); the
      last streamed block, the resident blocks and the head run while the next step's first block crosses;
    - no more streamed blocks than TORCH_OFFLOAD_BUFFERS: they stay in the buffers and nothing is copied.
    The torch engine runs on one GPU, so only c.gpus[0] counts.  0.0 for a candidate without a GPU."""
    if not c.gpus:
        return 0.0
    gpu = next(g for g in report.gpus if g.index == c.gpus[0])
    lay = c.layout
    n = shape.n_layers
    streamed = n - max(0, min(c.n_gpu_layers, n))
    hbm = (gpu.memory_bandwidth_gbps or UNKNOWN_GPU_BANDWIDTH_GBPS) * decode_efficiency(shape, c, gpu).share * 1e9
    link = min(pcie_gbps(gpu), report.ram_bandwidth_gbps) * 1e9
    layers = sum(lay.layer_bytes)
    read_ratio = (m.decode_bytes_per_token(lay, shape) - lay.head_bytes) / max(layers, 1)  # MoE: experts used
    kv_per_layer = m.kv_bytes(shape, c.ctx, c.kv_cache_type, swa_full=False, n_ubatch=c.n_batch) / n
    compute = [(b * read_ratio + kv_per_layer) / hbm + GPU_SECONDS_PER_LAYER for b in lay.layer_bytes]
    head = (lay.head_bytes + lay.other_bytes) / hbm
    if streamed <= TORCH_OFFLOAD_BUFFERS:
        t = sum(compute) + head
    else:
        copy = [b / link for b in lay.layer_bytes[:streamed]]
        t = sum(max(copy[j + 1], compute[j]) for j in range(streamed - 1))
        t += max(copy[0], sum(compute[streamed - 1 :]) + head)
    return round(1.0 / t, 1) if t > 0 else 0.0
