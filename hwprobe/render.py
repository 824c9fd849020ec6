"""Plain-text tables of a HardwareReport and a Plan, for `hearth probe` and `hearth plan`."""

from __future__ import annotations

from hwprobe.plan_types import Plan
from hwprobe.report import HardwareReport


def _src(sources: dict[str, str], key: str) -> str:
    return f"  [{sources[key]}]" if key in sources else ""


def report_text(r: HardwareReport) -> str:
    s = r.sources
    lines = [
        f"CPU   {r.cpu_model}: {r.cpu_cores} cores / {r.cpu_threads} threads, "
        f"AVX2 {'yes' if r.cpu_avx2 else 'no'}, AVX-512 {'yes' if r.cpu_avx512 else 'no'}{_src(s, 'cpu_model')}",
        f"RAM   {r.ram_available_mib} MiB available of {r.ram_total_mib} MiB{_src(s, 'ram_total_mib')}",
    ]
    if r.disk_free_mib is not None:
        lines.append(f"disk  {r.disk_free_mib} MiB free at {r.disk_path}{_src(s, 'disk_free_mib')}")
    if not r.gpus:
        lines.append("GPUs  none")
    else:
        lines.append(f"GPUs  driver {r.driver_version or '?'}, CUDA {r.cuda_version or '?'}")
        for g in r.gpus:
            pcie = f", PCIe gen {g.pcie_generation} x{g.pcie_width}" if g.pcie_generation else ""
            others = sum(p.used_mib for p in g.other_processes)
            lines.append(
                f"  [{g.index}] {g.name} (cc {g.compute_capability or '?'}{pcie}): "
                f"{g.memory_free_mib} MiB free of {g.memory_total_mib} MiB"
                + (f", {others} MiB held by {len(g.other_processes)} other process(es)" if others else "")
                + _src(g.sources, "memory_free_mib")
            )
            if g.nvlink_peers or g.p2p_peers:
                lines.append(f"      NVLink peers {list(g.nvlink_peers)}, P2P peers {list(g.p2p_peers)}")
    lines += [f"note  {n}" for n in r.notes]
    return "\n".join(lines)


def plan_text(p: Plan, model_name: str) -> str:
    layers = f"{p.n_gpu_layers}/{p.n_layers} layers on GPU"
    if p.cpu_expert_layers:
        layers += f" (experts of {p.cpu_expert_layers} in host RAM)"
    split = f", split {p.split_mode} {list(p.tensor_split)}" if p.split_mode != "none" else ""
    if p.tensor_parallel > 1:
        split += f", tensor_parallel={p.tensor_parallel}"
    if p.speculative.method != "off":
        split += f", speculative {p.speculative.method} k<={p.speculative.k}"
    lines = [
        f"{model_name}: {p.backend}, {p.quant}, {layers}{split}, context {p.ctx}, KV {p.kv_cache_type}, "
        f"flash attention {'on' if p.flash_attn else 'off'}, batch {p.batch_size}, "
        f"~{p.expected_tokens_per_s:.0f} tokens/s",
        f"{'device':<36}{'weights':>9}{'KV':>9}{'compute':>9}{'overhead':>9}{'total':>9}{'budget':>9}"
        f"{'headroom':>10}   (MiB)",
    ]
    for d in p.devices:
        name = (f"GPU {d.index} " if d.kind == "gpu" else "RAM ") + d.name
        lines.append(
            # host RAM's KV column holds the torch engine's swap space (a reason says how much)
            f"{name[:35]:<36}{d.weights_mib:>9}{d.kv_mib + d.swap_mib:>9}{d.compute_mib:>9}{d.overhead_mib:>9}"
            f"{d.total_mib:>9}{d.budget_mib:>9}{d.headroom_mib:>10}"
        )
    lines.append("why:")
    lines += [f"  - {r}" for r in p.reasons]
    return "\n".join(lines)
