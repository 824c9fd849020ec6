"""plan(report, shape, prefs) -> Plan: a pure function; the fastest that fits within the quality budget.

Policy (issues 3 and 41), in this order (budgets: free VRAM minus the safety margin of hwprobe.memory):
  1. the engine race (hwprobe/race.py) among everything that fits entirely on the GPUs at a useful context
     (target 8192 capped by the training context, down to 4096, then a q8_0 and a q4_0 KV cache for llama.cpp):
     - each torch-engine format (`torch_full`, on NVIDIA GPUs it supports, compute capability >= 7.5, for the
       architectures in hwprobe.support) on the fewest GPUs it fits: one, else all of them in tensor
       parallelism when NVLink/P2P joins them.  Formats (`torch_formats`): bf16/fp16 of a 16-bit source; for a
       quantized GGUF its own blocks ("GGUF", weight_map.REPACK_KIND), never decoded to 16 bits where its types
       have a kernel (16 bits only where none has, said so); W8A16 and FP8 (8.9+) quantized while loading,
       never below a GGUF's own bits; W4A16 only where llama.cpp has no better 4-bit file to run (a safetensors
       folder, or --backend torch), and there also W4A16+attn8 (precision per layer: attention W8A16, MLP W4A16);
     - each llama.cpp quant (`llama_full`): a GGUF file's own, or the ladder's for a config.json down to
       Q4_K_M (lower ones only when asked, with a warning);
     each with its expected speed from measured efficiencies (hwprobe/decode_speed.py) and its perplexity cost
     (hwprobe/quality.py); of those within Prefs.max_ppl_increase_pct the fastest for the command (one stream,
     or all of a server's streams: hwprobe.race.winner), else the best quality that fits;
  2. partial offload, the faster of two by estimated tokens/s: llama.cpp with as many layers on the GPUs as fit
     and the rest computed on the CPU from host RAM, at the lowest allowed quant; and the torch engine (where
     step 1 could run the model) keeping as many blocks on one GPU as fit and streaming the others from pinned
     host RAM over PCIe for every token (`torch_offload`);
     For a mixture-of-experts model a third contender joins step 2's race (`expert_placement`, hwprobe.experts):
     llama.cpp with every layer's attention, norms, shared experts and KV on one GPU, filled up with routed
     experts, and only the first blocks' overflow experts in host RAM (`cpu_expert_layers`); it wins when its
     estimate is higher, and the reasons give both numbers;
  3. CPU only.
One GPU is tried before several; several are tensor-split when all are P2P-joined, layer-split otherwise.
A safetensors folder (no file llama.cpp reads) or --backend torch that fits no GPU whole streams (step 2's torch
half, no race), else runs the torch engine on the CPU.
A user-fixed value (ctx, KV type, backend, quant, n_gpu_layers) is taken as given and the plan says what it costs;
--backend torch with --n-gpu-layers N (0 < N < layers) is planned as that streaming, with N blocks resident.
The candidates named in backticks are built in hwprobe/candidates.py; the steps are the rows of hwprobe/strategies.py's
table (STRATEGIES, and RACERS for step 1's race); this module runs the table and finishes the plan (placement,
tensor parallelism, the KV pool, swap space, the reasons).
"""

from __future__ import annotations

import dataclasses

from hwprobe import memory as m
from hwprobe import race
from hwprobe.candidates import (
    KV_LADDER,
    gpu_sets,
    llama_quants,
    torch_formats,
    try_llama_full,
)
from hwprobe.errors import ConfigError, PlanError
from hwprobe.placement import Candidate, expected_tokens_per_s, price, shares
from hwprobe.plan_types import PLANNED_BACKENDS, Plan, PlanCandidate, Prefs
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.strategies import Ask, Choice, choose
from hwprobe.strategies import serving as serving
from hwprobe.swap_space import with_swap_space
from hwprobe.tensor_parallel import tp_kv_fraction, tp_race_reason

_torch_formats = torch_formats  # tests/hwprobe/test_planner_torch_quant.py imports it from here


def _ctx_range(shape: ModelShape, prefs: Prefs) -> tuple[int, int]:
    if prefs.ctx:
        return prefs.ctx, prefs.ctx
    hi = min(prefs.target_ctx, shape.context_length)
    return min(prefs.min_ctx, hi), hi


def _tp_race(
    report: HardwareReport, shape: ModelShape, prefs: Prefs, lo: int, hi: int, quants, c: Candidate, tps: float
) -> str:
    """The reason a tensor-parallel torch plan gives: its estimate against llama.cpp's split of the same GPUs."""
    alt = try_llama_full(report, shape, dataclasses.replace(prefs, backend="llama.cpp"), lo, hi, quants)
    alt_tps = expected_tokens_per_s(report, shape, alt, price(report, shape, alt)) if alt is not None else 0.0
    return tp_race_reason(c.gpus, c.quant, tps, alt and (alt.split_mode, alt.quant), alt_tps)


def _with_flags(report: HardwareReport, shape: ModelShape, prefs: Prefs, c: Candidate) -> Candidate:
    """Apply a user-given n_gpu_layers (the plan then reports what it costs, fit or not)."""
    if prefs.n_gpu_layers is None:
        return c
    n = shape.n_layers if prefs.n_gpu_layers < 0 else min(prefs.n_gpu_layers, shape.n_layers)
    gpus = c.gpus or next((g for g, _ in gpu_sets(report)), ())
    return Candidate(
        c.backend,
        c.quant,
        c.layout,
        c.ctx,
        c.kv_cache_type,
        c.flash_attn,
        gpus if n else (),
        c.split_mode if n and gpus else "none",
        n if gpus else 0,
        c.n_batch,
    )


def plan(report: HardwareReport, shape: ModelShape, prefs: Prefs | None = None) -> Plan:
    """The best configuration for `shape` on the machine in `report` (see the module docstring)."""
    prefs = prefs or Prefs()
    _check(prefs)
    lo, hi = _ctx_range(shape, prefs)
    quants = llama_quants(shape, prefs)
    choice = choose(Ask(report, shape, prefs, lo, hi, quants))
    chosen = _with_flags(report, shape, prefs, choice.chosen)
    if chosen.backend == "torch":  # fitting needed one sequence; the pool takes up to max_num_seqs
        chosen = dataclasses.replace(chosen, max_num_seqs=prefs.max_num_seqs)
    devices = price(report, shape, chosen)
    if prefs.n_gpu_layers is None and not all(d.headroom_mib >= 0 for d in devices):
        raise _no_fit(report, shape, chosen, devices)
    main, device, split = _placement(report, chosen)
    final = race.entry(report, shape, chosen, prefs, serving(prefs), devices)
    tps = final.tokens_per_s
    why = _reasons(report, shape, prefs, chosen, devices, tps, quants, choice)
    tensor_parallel, tp_why = _tensor_parallel(report, shape, prefs, lo, hi, quants, chosen, tps)
    pool = _kv_pool_bytes(shape, chosen, devices, tensor_parallel)
    one_gpu = chosen.backend == "torch" and len(chosen.gpus) == 1 and tensor_parallel == 1
    devices, swap, swap_reason = with_swap_space(shape, chosen.kv_cache_type, pool if one_gpu else 0, devices)
    why = (*why, *tp_why, *(() if swap_reason is None else (swap_reason,)))
    return Plan(
        backend=chosen.backend,
        quant=chosen.quant,
        n_gpu_layers=chosen.n_gpu_layers,
        n_layers=shape.n_layers,
        split_mode=chosen.split_mode,
        tensor_split=split,
        ctx=chosen.ctx,
        kv_cache_type=chosen.kv_cache_type,
        flash_attn=chosen.flash_attn,
        batch_size=chosen.n_batch,
        devices=devices,
        expected_tokens_per_s=tps,
        reasons=why,
        main_gpu=main,
        device=device,
        kv_pool_bytes=pool,
        max_num_seqs=chosen.max_num_seqs,
        cpu_expert_layers=chosen.cpu_expert_layers,
        tensor_parallel=tensor_parallel,
        serving=serving(prefs),
        kv_pool_tokens=_kv_pool_tokens(chosen, devices),
        swap_space_bytes=swap,
        candidates=_candidates(shape, prefs, choice.raced, final),
        expected_aggregate_tokens_per_s=final.aggregate,
    )


def _reasons(
    report: HardwareReport,
    shape: ModelShape,
    prefs: Prefs,
    chosen: Candidate,
    devices,
    tps: float,
    quants,
    choice: Choice,
) -> tuple[str, ...]:
    """The plan's reasons (hwprobe.explain), then the speed race's."""
    from hwprobe.explain import reasons  # lazy: keeps `hearth --help` light (+2 hearth modules)

    tried = _torch_tried(report, shape, prefs, chosen)
    why = reasons(
        report,
        shape,
        prefs,
        chosen,
        devices,
        tps,
        quants,
        tried,
        choice.rival,
        choice.expert_race,
        choice.single,
        choice.raced,
    )
    return why if choice.race_why is None else (*why, choice.race_why)


def _tensor_parallel(
    report, shape, prefs, lo, hi, quants, chosen: Candidate, tps: float
) -> tuple[int, tuple[str, ...]]:
    """The plan's tensor-parallel ranks and the reason they add: the torch engine split over joined GPUs against
    llama.cpp's split, or the CPU's cores shared by the ranks asked for."""
    if chosen.backend == "torch" and chosen.split_mode == "tensor" and len(chosen.gpus) > 1:
        return len(chosen.gpus), (_tp_race(report, shape, prefs, lo, hi, quants, chosen, tps),)
    if chosen.backend == "torch" and not chosen.gpus and prefs.tensor_parallel:  # CPU ranks, asked for
        ranks = prefs.tensor_parallel
        if ranks <= 1:
            return ranks, ()
        return ranks, (
            f"tensor parallel: {ranks} ranks share the CPU's {report.cpu_cores} cores, each "
            "holding its share of the weights and of the KV pool's heads (a rank reads the whole file "
            "while loading); on a CPU this checks the split, it is slower than one rank",
        )
    return 1, ()


def _placement(report: HardwareReport, c: Candidate) -> tuple[int, str, tuple[float, ...]]:
    """(main GPU, torch device, llama.cpp's tensor split: each GPU's share where several are used)."""
    share = shares(report, c.gpus)
    split = tuple(round(share.get(g.index, 0.0), 3) for g in report.gpus) if len(c.gpus) > 1 else ()
    main = c.gpus[0] if c.split_mode == "tensor" or len(c.gpus) == 1 else (c.gpus[-1] if c.gpus else 0)
    device = "cpu" if not c.gpus else ("cuda" if len(c.gpus) > 1 else f"cuda:{c.gpus[0]}")
    return main, device, split


def _candidates(
    shape: ModelShape, prefs: Prefs, raced: tuple[PlanCandidate, ...], final: race.Entry
) -> tuple[PlanCandidate, ...]:
    """What the plan lists as weighed: the race, else (no race, or the flags changed what it chose) the plan as
    it is."""
    if raced and prefs.n_gpu_layers in (None, -1, shape.n_layers):
        return raced
    return (dataclasses.replace(final.summary, chosen=True),)


def _kv_pool_tokens(c: Candidate, devices: tuple) -> int:
    """Tokens of KV the plan reserves: the torch engine's pool (every tensor-parallel rank holds the same
    tokens), llama.cpp's ctx cells."""
    if c.backend != "torch":
        return c.ctx
    return max((d.kv_pool_tokens for d in devices), default=0)


def _kv_pool_bytes(shape: ModelShape, c: Candidate, devices: tuple, tensor_parallel: int = 1) -> int:
    """The torch engine's KV pool in bytes (whole blocks, placement._with_kv_pool); 0 for llama.cpp.  With
    tensor parallelism, what each rank allocates for its heads (LoadOptions.kv_cache_bytes is per rank): the
    busiest rank's share of the pool's tokens."""
    if c.backend != "torch":
        return 0
    if tensor_parallel > 1:
        tokens = max(d.kv_pool_tokens for d in devices)
        return int(
            tokens
            * m.kv_bytes_per_token(shape, c.kv_cache_type)
            * tp_kv_fraction(shape.n_heads, shape.n_kv_heads, tensor_parallel)
        )
    return sum(d.kv_pool_tokens for d in devices) * m.kv_bytes_per_token(shape, c.kv_cache_type)


def _torch_tried(report: HardwareReport, shape: ModelShape, prefs: Prefs, c: Candidate) -> tuple[str, ...]:
    """The torch formats better than the chosen one, which did not fit (for the reasons); for a plan streaming
    blocks, every format (none fit whole, and the chosen one is the fastest to stream, not the best)."""
    if c.backend != "torch" or not c.gpus:
        return ()
    formats = torch_formats([g for g in report.gpus if g.index in c.gpus], shape, prefs)
    if c.n_gpu_layers < shape.n_layers:
        return tuple(formats)
    return tuple(formats[: formats.index(c.quant)]) if c.quant in formats else ()


def _check(prefs: Prefs) -> None:
    if prefs.backend not in ("auto", *PLANNED_BACKENDS):
        raise ConfigError(f"backend must be auto, {', '.join(PLANNED_BACKENDS)}, got {prefs.backend!r}")
    if prefs.quant is not None and prefs.quant not in m.QUANT_BPW:
        raise ConfigError(f"unknown quant {prefs.quant!r}", f"use one of {', '.join(m.QUANT_LADDER)}")
    if prefs.kv_cache_type not in (None, *KV_LADDER):
        raise ConfigError(f"KV cache type must be f16, q8_0 or q4_0, got {prefs.kv_cache_type!r}")
    if prefs.ctx is not None and prefs.ctx < 16:
        raise ConfigError(f"context must be at least 16 tokens, got {prefs.ctx}")
    if prefs.tensor_parallel is not None and prefs.tensor_parallel < 1:
        raise ConfigError(f"--tensor-parallel must be 1 or more ranks, got {prefs.tensor_parallel}")
    if prefs.tensor_parallel and prefs.tensor_parallel > 1 and prefs.backend == "llama.cpp":
        raise ConfigError(
            "--tensor-parallel is the torch engine's; llama.cpp splits across GPUs by itself",
            "drop --tensor-parallel, or use --backend torch",
        )


def _no_fit(report: HardwareReport, shape: ModelShape, c: Candidate, devices) -> PlanError:
    over = [d for d in devices if d.headroom_mib < 0]
    d = over[0]
    where = "host RAM" if d.kind == "cpu" else f"GPU {d.index}"
    return PlanError(
        f"{shape.name} needs {d.total_mib / 1024:.1f} GiB in {where} (weights {d.weights_mib / 1024:.1f} + KV "
        f"{d.kv_mib / 1024:.1f} at {c.ctx} tokens + compute {d.compute_mib / 1024:.1f}) but only "
        f"{d.budget_mib / 1024:.1f} GiB is available there",
        f"try a smaller --ctx, --kv-cache-type q4_0{', a smaller quant' if not shape.quant else ''}, or close "
        "programs that hold memory",
    )
