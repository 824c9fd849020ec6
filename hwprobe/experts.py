"""Expert placement: a mixture-of-experts model that does not fit its GPU whole keeps every layer's attention,
norms, router, shared experts and KV cache on the GPU, fills the rest of the GPU with routed experts, and keeps
only the overflow experts in host RAM (issue 18 item 3).

With llama.cpp this is `n_gpu_layers = n_layers` plus tensor buffer overrides that pin the routed experts
(`blk.N.ffn_{gate,up,down}_exps`) of the first `cpu_expert_layers` layers to the CPU buffer type: what
`-ot exps=CPU` / `--n-cpu-moe N` do (backends/llama_cpp/overrides.py).  The CPU then multiplies only those
experts, and of them only the n_experts_used a token is routed to, while plain layer offload makes the CPU run
whole layers: their attention over a KV cache that also lives in host RAM, and their experts.

Assumed for the estimate (expert_tokens_per_s), on the same terms as placement.expected_tokens_per_s:
- the GPU reads, per token, everything it holds except the routed experts, plus n_experts_used / n_experts of
  the routed experts it holds, and the KV cache, at GPU bandwidth x llama.cpp's measured share there
  (hwprobe.decode_speed), plus GPU_SECONDS_PER_LAYER for every layer;
- the CPU reads n_experts_used / n_experts of the routed experts in host RAM at RAM bandwidth x
  CPU_BANDWIDTH_EFFICIENCY;
- each layer whose experts are on the CPU hands the hidden state over and back (HOP_SECONDS: two small copies
  and a synchronisation; an assumption, not measured here: no GPU);
- GPU and CPU take turns (times add up), as in layer offload.
Only one GPU: llama.cpp splits by layer across GPUs, and expert placement is planned where one card is short.
"""

from __future__ import annotations

from dataclasses import replace

from hwprobe import memory as m
from hwprobe.bandwidth import (
    CPU_BANDWIDTH_EFFICIENCY,
    GPU_SECONDS_PER_LAYER,
    UNKNOWN_GPU_BANDWIDTH_GBPS,
)
from hwprobe.decode_speed import efficiency
from hwprobe.plan_types import DeviceMemory
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape

HOP_SECONDS = 20e-6  # per layer with host experts: hidden state to the host and back (assumed, see above)


def expert_layer_bytes(shape: ModelShape, layout: m.WeightLayout) -> tuple[int, ...]:
    """Bytes of each block's routed experts in `layout`: the file's own (shape.expert_bytes) when the layout is
    the file's bytes, else the block's bytes x memory.routed_expert_share."""
    if len(shape.expert_bytes) == shape.n_layers and tuple(layout.layer_bytes) == tuple(shape.layer_bytes):
        return tuple(shape.expert_bytes)
    share = m.routed_expert_share(shape)
    return tuple(int(b * share) for b in layout.layer_bytes)


def host_expert_bytes(shape: ModelShape, layout: m.WeightLayout, cpu_expert_layers: int) -> int:
    """Routed-expert bytes in host RAM: those of the first `cpu_expert_layers` blocks (--n-cpu-moe's choice)."""
    return sum(expert_layer_bytes(shape, layout)[:cpu_expert_layers])


def cpu_expert_compute_bytes(shape: ModelShape, n_ubatch: int) -> int:
    """The CPU's compute buffer for expert matmuls of a batch: each token's hidden state in and out, and the
    gate and up activations of its n_experts_used experts, in float32."""
    return 4 * n_ubatch * (2 * shape.hidden_size + 2 * shape.ffn_size * max(shape.n_experts_used, 1))


def with_host_experts(
    shape: ModelShape, layout: m.WeightLayout, cpu_expert_layers: int, n_ubatch: int, devices: tuple[DeviceMemory, ...]
) -> tuple[DeviceMemory, ...]:
    """`devices` priced with every layer on one GPU, with the experts of the first `cpu_expert_layers` blocks
    moved from that GPU to host RAM (rounded so that neither side looks smaller than it is)."""
    moved = host_expert_bytes(shape, layout, cpu_expert_layers)
    out = []
    for d in devices:
        if d.kind == "gpu" and d.used:
            d = replace(d, weights_mib=d.weights_mib - moved // m.MIB)
        elif d.kind == "cpu":
            d = replace(
                d,
                weights_mib=d.weights_mib + m.mib(moved),
                compute_mib=d.compute_mib + m.mib(cpu_expert_compute_bytes(shape, n_ubatch)),
            )
        out.append(d)
    return tuple(out)


def expert_tokens_per_s(
    report: HardwareReport,
    shape: ModelShape,
    layout: m.WeightLayout,
    gpu_index: int,
    cpu_expert_layers: int,
    kv_bytes: int,
) -> float:
    """Single-stream decode speed with expert placement (the module docstring's assumptions)."""
    gpu = next(g for g in report.gpus if g.index == gpu_index)
    used = shape.n_experts_used / shape.n_experts if shape.n_experts else 1.0
    experts = expert_layer_bytes(shape, layout)
    k = cpu_expert_layers
    dense = sum(layout.layer_bytes) - sum(experts) + layout.head_bytes + layout.other_bytes
    gpu_bytes = dense + used * sum(experts[k:]) + kv_bytes
    share = efficiency("llama.cpp", "ggml", gpu.cc, gpu.decode_records).share
    t = gpu_bytes / ((gpu.memory_bandwidth_gbps or UNKNOWN_GPU_BANDWIDTH_GBPS) * share * 1e9)
    t += GPU_SECONDS_PER_LAYER * shape.n_layers
    t += used * sum(experts[:k]) / (report.ram_bandwidth_gbps * CPU_BANDWIDTH_EFFICIENCY * 1e9)
    t += HOP_SECONDS * k
    return round(1.0 / t, 1) if t > 0 else 0.0


def race_sentence(
    shape: ModelShape,
    chosen_is_experts: bool,
    experts_tps: float,
    cpu_expert_layers: int,
    host_bytes: int,
    layer_tps: float,
    n_gpu_layers: int,
    gpu_index: int,
) -> str:
    """One sentence: expert placement against plain layer offload, both estimates, and which one the plan takes."""
    n = shape.n_layers
    winner = "expert placement is faster" if chosen_is_experts else "layer offload is faster"
    return (
        f"MoE placement: attention, norms, router{', shared experts' if shape.shared_ffn_size else ''} and "
        f"KV of all {n} layers on GPU {gpu_index} with the routed experts of the first {cpu_expert_layers} "
        f"in host RAM ({host_bytes / 2**30:.1f} GiB, {shape.n_experts_used} of {shape.n_experts} read per "
        f"token) gives ~{experts_tps:.1f} tokens/s; plain layer offload ({n_gpu_layers} of {n} layers on the "
        f"GPU, the rest computed whole by the CPU) ~{layer_tps:.1f} tokens/s: {winner}"
    )
