"""The plan's reasons: short sentences with the numbers, and warnings, for `hearth plan` and `run --verbose`."""

from __future__ import annotations

import dataclasses

from hwprobe import memory as m
from hwprobe.experts import host_expert_bytes, race_sentence
from hwprobe.explain_engine import backend_reasons, gib
from hwprobe.placement import (
    CPU_BANDWIDTH_EFFICIENCY,
    TORCH_OFFLOAD_BUFFERS,
    Candidate,
    decode_efficiency,
    is_torch_offload,
    pcie_gbps,
    pcie_link,
)
from hwprobe.plan_types import DeviceMemory, PlanCandidate, Prefs
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.support import torch_engine_refusal


def _link(report: HardwareReport, c: Candidate) -> tuple[str, float, bool]:
    """The link a torch offload candidate's copies cross ("PCIe 4.0 x16"), the GB/s they get (the link's, or host
    RAM's if slower: placement.torch_offload_tokens_per_s) and whether host RAM is what limits them."""
    gpu = next((g for g in report.gpus if g.index == c.gpus[0]), None)
    gen, width = pcie_link(gpu)
    return (
        f"PCIe {gen}.0 x{width}",
        min(pcie_gbps(gpu), report.ram_bandwidth_gbps),
        report.ram_bandwidth_gbps < pcie_gbps(gpu),
    )


def _streamed_bytes(shape: ModelShape, c: Candidate) -> int:
    """Weight bytes a torch offload candidate copies per token: its streamed blocks, unless the buffers hold them."""
    streamed = shape.n_layers - c.n_gpu_layers
    return sum(c.layout.layer_bytes[:streamed]) if streamed > TORCH_OFFLOAD_BUFFERS else 0


def _offload_race(
    report: HardwareReport, shape: ModelShape, c: Candidate, tps: float, rival: tuple[Candidate, float]
) -> str:
    """One sentence: both partial offloads' estimates, and what made the winner faster (bytes per token and the
    rate each moves them at: the PCIe link for the torch engine, host RAM read by the CPU for llama.cpp)."""
    (t, t_tps), (ll, l_tps) = ((c, tps), rival) if c.backend == "torch" else (rival, (c, tps))
    link, link_gbps, ram_bound = _link(report, t)
    n = shape.n_layers
    limited = ", host RAM being slower than the link" if ram_bound else ""
    torch_part = (
        f"the torch engine streaming {n - t.n_gpu_layers} of {n} layers ({t.quant}) over {link} "
        f"(~{link_gbps:.0f} GB/s{limited}) gives ~{t_tps:.1f} tokens/s"
    )
    cpu_layers = n - ll.n_gpu_layers if ll.gpus else n
    cpu_gbps = report.ram_bandwidth_gbps * CPU_BANDWIDTH_EFFICIENCY
    cpu_bytes = sum(ll.layout.layer_bytes[:cpu_layers])
    llama_part = (
        f"llama.cpp computing {cpu_layers} of them on the CPU ({ll.quant}, host RAM read at "
        f"~{cpu_gbps:.0f} GB/s) ~{l_tps:.1f} tokens/s"
    )
    moved = (
        f"{_streamed_bytes(shape, t) / 2**30:.1f} GiB of weights a token over the link against "
        f"{cpu_bytes / 2**30:.1f} GiB read by the CPU"
    )
    winner = "the torch engine" if c.backend == "torch" else "llama.cpp"
    return f"partial offload: {torch_part}; {llama_part}: {winner} is faster ({moved})"


def _kv_pool(c: Candidate, devices: tuple[DeviceMemory, ...], prefs: Prefs) -> str:
    """One sentence: the torch engine's KV pool, in bytes, tokens and full-context sequences, and what sized it."""
    d = next(d for d in devices if d.kv_pool_tokens)
    seqs = d.kv_pool_tokens // c.ctx
    where = "host RAM" if d.kind == "cpu" else f"GPU {d.index}"
    budget = f"{where}'s budget"
    if c.split_mode == "tensor" and len(c.gpus) > 1:  # every rank holds the same tokens, its share of the heads
        shared = [x for x in devices if x.kv_pool_tokens]
        where = "GPUs " + ", ".join(f"{x.index} ({gib(x.kv_mib)})" for x in shared)
        d = dataclasses.replace(d, kv_mib=sum(x.kv_mib for x in shared))
        budget = "the tightest GPU's budget, for the rank with most KV heads,"
    why = (
        f"max_num_seqs {c.max_num_seqs}"
        if seqs >= c.max_num_seqs
        else f"what {budget} leaves after weights, compute and overhead; max_num_seqs {c.max_num_seqs} would need more"
    )
    use = f", sized for {prefs.sequences_for}" if prefs.sequences_for else ""
    # On a GPU the pool is allocated whole at load (CUDA graphs keep its addresses); in host RAM the engine
    # reserves it and commits its blocks' pages as sequences first reach them (backends/torch_engine/kv_pool.py)
    how = (
        "the engine reserves exactly this and commits it in blocks as sequences grow"
        if d.kind == "cpu"
        else "the engine allocates exactly this"
    )
    return (
        f"KV pool {c.kv_cache_type}: {gib(d.kv_mib)} in {where}, {d.kv_pool_tokens} tokens = {seqs} "
        f"full-context sequence{'s' if seqs != 1 else ''} of {c.ctx} tokens ({why}){use}; {how}"
    )


def _speed(tps: float) -> str:
    return f"{tps:.1f}" if tps < 10 else f"{tps:.0f}"  # a partial offload's 2.4 is not "2"


def serving_reason(
    shape: ModelShape, prefs: Prefs, c: Candidate, tps: float, single: tuple[Candidate, float] | None
) -> str | None:
    """One sentence for `hearth serve` (Prefs.prefer_batching): which engine serves concurrent clients and why,
    with the numbers the planner has; None when the plan was not made for serving."""
    if not prefs.prefer_batching:
        return None
    n = prefs.max_num_seqs
    if prefs.backend != "auto":
        return f"serving: backend {prefs.backend} as asked (--backend wins over the serving plan)" + (
            "; it answers one request at a time, the others queue" if c.backend == "llama.cpp" else ""
        )
    if n <= 1:
        return "single user (max concurrency 1): planned for the fastest single stream"
    read_gib = m.decode_bytes_per_token(c.layout, shape) / 2**30
    if c.backend == "torch":
        out = (
            f"serving: up to {n} requests at once, batched by the torch engine (continuous batching: one "
            f"forward a step, reading the {read_gib:.2f} GiB of weights once for every request in it)"
        )
        if single is not None:
            ll, l_tps = single
            out += (
                f"; llama.cpp here ({ll.quant}) would answer one request at a time: ~{_speed(l_tps)} tokens/s "
                f"in all, its single-stream estimate from memory bandwidth (the torch engine's single stream: "
                f"~{_speed(tps)})"
            )
        return out
    one = "serving: llama.cpp answers one request at a time (the others queue), "
    refusal = torch_engine_refusal(shape)
    if refusal:
        return one + f"because the torch engine, which batches, cannot run this model: {refusal}"
    if c.gpus:
        return one + (
            f"because the torch engine, which batches, does not fit {shape.name} entirely on the GPU "
            f"(llama.cpp's {c.quant} does)"
            if c.n_gpu_layers >= shape.n_layers
            else "because the torch engine, which batches, cannot stream this model's blocks from host RAM "
            "within the budgets"
        )
    return one + (
        f"because the torch engine's weights and KV pool for {n} sequences do not fit host RAM "
        "(try --max-concurrency 4 or a smaller --ctx)"
    )


def reasons(
    report: HardwareReport,
    shape: ModelShape,
    prefs: Prefs,
    c: Candidate,
    devices: tuple[DeviceMemory, ...],
    tps: float,
    quants: list[tuple[str, m.WeightLayout]],
    torch_tried: tuple[str, ...] = (),
    rival: tuple[Candidate, float] | None = None,
    expert_race: tuple[Candidate, float, Candidate, float] | None = None,
    single: tuple[Candidate, float] | None = None,
    raced: tuple[PlanCandidate, ...] = (),
) -> tuple[str, ...]:
    """torch_tried: the torch formats better than c's that did not fit (GPU plans of the torch engine; every
    format for one streaming blocks); raced: what the speed race weighed (hwprobe.race), when it ran; rival: the
    partial offload of the other engine that c was faster than (or c lost to nothing: None), with its tokens/s;
    expert_race: (expert placement, its tokens/s, the layer offload it raced, its tokens/s) for a MoE model that
    did not fit whole (hwprobe.experts); single: when serving put the torch engine on the CPU, the llama.cpp plan
    it replaced with its single-stream tokens/s."""
    out: list[str] = []
    serve = serving_reason(shape, prefs, c, tps, single)
    if serve:
        out.append(serve)
    offload = is_torch_offload(shape, c)
    out += _gpu_reasons(report)
    used = [d for d in devices if d.kind == "gpu" and d.used]
    out += backend_reasons(report, shape, prefs, c, torch_tried, single, offload, raced)
    if rival is not None:
        out.append(_offload_race(report, shape, c, tps, rival))
    if expert_race is not None:
        out.append(_expert_race(shape, c, expert_race))
    out += _quant_reasons(shape, c, quants)
    out += _placement_reasons(shape, c, offload)
    out += _memory_reasons(shape, prefs, c, devices)
    if used or not report.gpus or c.gpus == ():
        out.append(_speed_reason(report, shape, c, offload, tps))
    return tuple(out)


def _gpu_reasons(report: HardwareReport) -> list[str]:
    """Each GPU's free memory, what other programs hold, and the plan's budget after the safety margin."""
    if not report.gpus:
        return ["no NVIDIA GPU found: the model runs from host RAM"]
    out: list[str] = []
    for g in report.gpus:
        held = g.memory_total_mib - g.memory_free_mib
        out.append(
            f"GPU {g.index} {g.name}: {g.memory_free_mib} MiB free of {g.memory_total_mib}"
            f"{f' ({held} MiB held by other programs)' if held > 512 else ''}; plan budget "
            f"{m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) // m.MIB} MiB after the safety margin"
        )
    return out


def _expert_race(shape: ModelShape, c: Candidate, expert_race: tuple[Candidate, float, Candidate, float]) -> str:
    """One sentence: expert placement against the layer offload it raced (hwprobe.experts.race_sentence)."""
    ex, ex_tps, layers, layers_tps = expert_race
    return race_sentence(
        shape,
        c is ex,
        ex_tps,
        ex.cpu_expert_layers,
        host_expert_bytes(shape, ex.layout, ex.cpu_expert_layers),
        layers_tps,
        layers.n_gpu_layers,
        ex.gpus[0],
    )


def _quant_reasons(shape: ModelShape, c: Candidate, quants: list[tuple[str, m.WeightLayout]]) -> list[str]:
    """The GGUF ladder's quant chosen for a config.json (and the better ones that do not fit), and a warning
    below the lowest default quant."""
    out: list[str] = []
    if not shape.quant and c.backend == "llama.cpp" and len(quants) > 1:
        better = [q for q, _ in quants[: [q for q, _ in quants].index(c.quant)]]
        out.append(
            f"quant {c.quant}: the best of the GGUF ladder that fits"
            + (f" ({', '.join(better)} do not)" if better else "")
        )
    if c.quant in m.QUANT_LADDER and m.QUANT_LADDER.index(c.quant) > m.QUANT_LADDER.index(m.LOWEST_DEFAULT_QUANT):
        out.append(
            f"warning: {c.quant} is below {m.LOWEST_DEFAULT_QUANT}: expect clearly worse quality "
            "(measure it with `hearth ppl`)"
        )
    return out


def _placement_reasons(shape: ModelShape, c: Candidate, offload: bool) -> list[str]:
    """Where the layers go: how many on which GPUs (and what streams or stays in host RAM), and the split."""
    out: list[str] = []
    if c.gpus:
        layers = "all" if c.n_gpu_layers >= shape.n_layers else str(c.n_gpu_layers)
        streamed = shape.n_layers - c.n_gpu_layers
        buffers = min(TORCH_OFFLOAD_BUFFERS, streamed)
        rest = (
            f", the first {streamed} streamed from pinned host RAM through {buffers} GPU "
            f"buffer{'s' if buffers > 1 else ''} of {m.mib(max(c.layout.layer_bytes[:streamed]))} MiB (every "
            "layer's KV cache stays on the GPU)"
            if offload
            else f", {streamed} in host RAM (slower)"
        )
        out.append(
            f"{layers} of {shape.n_layers} layers on {'GPUs ' if len(c.gpus) > 1 else 'GPU '}"
            f"{', '.join(map(str, c.gpus))}"
            + ("" if c.n_gpu_layers >= shape.n_layers else rest)
            + (
                f", but the routed experts of the first {c.cpu_expert_layers} in host RAM (llama.cpp tensor "
                "buffer overrides)"
                if c.cpu_expert_layers
                else ""
            )
        )
        if len(c.gpus) > 1:
            out.append(
                f"split {c.split_mode}: "
                + (
                    "the GPUs are joined by NVLink/P2P, so each layer is split across them"
                    if c.split_mode == "tensor"
                    else "no P2P between the GPUs, so each holds whole layers"
                )
            )
    return out


def _memory_reasons(shape: ModelShape, prefs: Prefs, c: Candidate, devices: tuple[DeviceMemory, ...]) -> list[str]:
    """The context, the KV cache, the experts, and each device's memory against its budget."""
    out: list[str] = []
    trained = shape.context_length
    asked = "asked for" if prefs.ctx else f"target {min(prefs.target_ctx, trained)}"
    out.append(f"context {c.ctx} tokens ({asked}; trained on {trained})")
    kv_mib = sum(d.kv_mib for d in devices)
    if c.backend == "torch":
        out.append(_kv_pool(c, devices, prefs))
    else:
        out.append(
            f"KV cache {c.kv_cache_type}: {gib(kv_mib)} at {c.ctx} tokens"
            + ("" if c.kv_cache_type == "f16" else " (quantized to fit)" if not prefs.kv_cache_type else "")
        )
    if shape.n_experts:
        out.append(
            f"MoE: all {shape.n_experts} experts counted in memory, {shape.n_experts_used} read per token"
            + (" (those in host RAM by the CPU)" if c.cpu_expert_layers else "")
        )
    for d in devices:
        if d.used:
            name = "host RAM" if d.kind == "cpu" else f"GPU {d.index}"
            out.append(
                f"{name}: {gib(d.total_mib)} of {gib(d.budget_mib)} (weights {gib(d.weights_mib)}, KV "
                f"{gib(d.kv_mib)}, compute {gib(d.compute_mib)}, overhead {gib(d.overhead_mib)}), "
                f"{gib(d.headroom_mib)} headroom"
            )
            if d.headroom_mib < 0:
                out.append(
                    f"warning: {name} is over its budget by {-d.headroom_mib} MiB: loading may run out "
                    "of memory (from --n-gpu-layers)"
                )
    return out


def _speed_reason(report: HardwareReport, shape: ModelShape, c: Candidate, offload: bool, tps: float) -> str:
    """The expected decode speed, the bandwidth it comes from and the measured share of it (decode_speed)."""
    bw = ", ".join(
        f"{g.memory_bandwidth_gbps or 'unknown'} GB/s at {100 * decode_efficiency(shape, c, g).share:.0f} %"
        for g in report.gpus
        if g.index in c.gpus
    )
    if offload:
        link, link_gbps, _ = _link(report, c)
        bw += f"; blocks over {link}, ~{link_gbps:.0f} GB/s"
    return f"expected decode ~{_speed(tps)} tokens/s from memory bandwidth" + (
        f" ({bw})" if bw else f" (host RAM {report.ram_bandwidth_gbps:.0f} GB/s)"
    )
