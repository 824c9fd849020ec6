"""plan(report, shape, prefs) -> Plan: a pure function; the fastest that fits within the quality budget.

Policy (issues 3 and 41), in this order (budgets: free VRAM minus the safety margin of hwprobe.memory):
  1. the engine race (hwprobe/race.py) among everything that fits entirely on the GPUs at a useful context
     (target 8192 capped by the training context, down to 4096, then a q8_0 and a q4_0 KV cache for llama.cpp):
     - each torch-engine format (`_torch_full`, on NVIDIA GPUs it supports, compute capability >= 7.5, for the
       architectures in hwprobe.support) on the fewest GPUs it fits: one, else all of them in tensor
       parallelism when NVLink/P2P joins them.  Formats (`_torch_formats`): bf16/fp16 of a 16-bit source; for a
       quantized GGUF its own blocks ("GGUF", weight_map.REPACK_KIND), never decoded to 16 bits where its types
       have a kernel (16 bits only where none has, said so); W8A16 and FP8 (8.9+) quantized while loading,
       never below a GGUF's own bits; W4A16 only where llama.cpp has no better 4-bit file to run (a safetensors
       folder, or --backend torch);
     - each llama.cpp quant (`_llama_full`): a GGUF file's own, or the ladder's for a config.json down to
       Q4_K_M (lower ones only when asked, with a warning);
     each with its expected speed from measured efficiencies (hwprobe/decode_speed.py) and its perplexity cost
     (hwprobe/quality.py); of those within Prefs.max_ppl_increase_pct the fastest for the command (one stream,
     or all of a server's streams: hwprobe.race.winner), else the best quality that fits;
  2. partial offload, the faster of two by estimated tokens/s: llama.cpp with as many layers on the GPUs as fit
     and the rest computed on the CPU from host RAM, at the lowest allowed quant; and the torch engine (where
     step 1 could run the model) keeping as many blocks on one GPU as fit and streaming the others from pinned
     host RAM over PCIe for every token (`_torch_offload`);
     For a mixture-of-experts model a third contender joins step 2's race (`_expert_placement`, hwprobe.experts):
     llama.cpp with every layer's attention, norms, shared experts and KV on one GPU, filled up with routed
     experts, and only the first blocks' overflow experts in host RAM (`cpu_expert_layers`); it wins when its
     estimate is higher, and the reasons give both numbers;
  3. CPU only.
One GPU is tried before several; several are tensor-split when all are P2P-joined, layer-split otherwise.
A safetensors folder (no file llama.cpp reads) or --backend torch that fits no GPU whole streams (step 2's torch
half, no race), else runs the torch engine on the CPU.
A user-fixed value (ctx, KV type, backend, quant, n_gpu_layers) is taken as given and the plan says what it costs;
--backend torch with --n-gpu-layers N (0 < N < layers) is planned as that streaming, with N blocks resident.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from hwprobe import memory as m
from hwprobe import race
from hwprobe.errors import ConfigError, PlanError
from hwprobe.fit_search import best_ctx, fits, fits_gpus, largest, most_layers
from hwprobe.placement import Candidate, expected_tokens_per_s, price, shares, torch_offload_tokens_per_s
from hwprobe.plan_types import PLANNED_BACKENDS, Plan, PlanCandidate, Prefs
from hwprobe.report import GpuInfo, HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.support import (
    BF16_MIN_CC,
    FP8_MIN_CC,
    TORCH_ENGINE_MAX_GPUS,
    TORCH_ENGINE_MIN_CC,
    TORCH_ENGINE_RUNNABLE_FORMATS,
    torch_engine_refusal,
)
from hwprobe.swap_space import with_swap_space
from hwprobe.tensor_parallel import TORCH_QUALITY, no_tp_error, shape_tp_ok, tp_kv_fraction, tp_race_reason

KV_LADDER = ("f16", "q8_0", "q4_0")


def _gpu_sets(report: HardwareReport) -> Iterator[tuple[tuple[int, ...], str]]:
    """GPU groups to try: the one with most budget alone, then all of them (tensor split if all P2P-joined)."""
    usable = [g for g in report.gpus if m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) > 0]
    if not usable:
        return
    best = max(usable, key=lambda g: (m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib), -g.index))
    yield (best.index,), "none"
    if len(usable) > 1:
        ids = tuple(g.index for g in usable)
        joined = all(j in g.p2p_peers or j in g.nvlink_peers for g in usable for j in ids if j != g.index)
        yield ids, "tensor" if joined else "layer"


def _ctx_range(shape: ModelShape, prefs: Prefs) -> tuple[int, int]:
    if prefs.ctx:
        return prefs.ctx, prefs.ctx
    hi = min(prefs.target_ctx, shape.context_length)
    return min(prefs.min_ctx, hi), hi


def _torch_formats(gpus: Iterable[GpuInfo], shape: ModelShape, prefs: Prefs) -> list[str]:
    """The torch engine's weight formats for these GPUs, best quality first (the module docstring's step 1; the
    race then weighs them by speed within the quality budget).

    W8A16 before FP8: the same bytes, and int8 per channel keeps more of the weights than e4m3 (measured on the
    starter, 1024 tokens of tests/data/english.txt: perplexity 14.76 dense, 14.72 W8A16, 14.98 FP8), and the
    weight-only FP8 kernel reads as many bytes and widens them to 16 bits for its matmul, so it should be no
    faster (not measured: no GPU yet)."""
    ccs = [g.cc for g in gpus]
    if not ccs or any(cc is None or cc < TORCH_ENGINE_MIN_CC for cc in ccs):
        return []
    half = "bf16" if all(cc >= BF16_MIN_CC for cc in ccs) else "fp16"  # type: ignore[operator]
    eight = ["W8A16"] + (["FP8"] if all(cc >= FP8_MIN_CC for cc in ccs) else [])  # type: ignore[operator]
    # W4A16 only where llama.cpp cannot run a better 4-bit file instead (see the module docstring)
    int4 = ["W4A16"] if prefs.backend == "torch" or (shape.extra or {}).get("file_format") == "safetensors" else []
    if shape.quant:  # a GGUF source: its own blocks, or a format of at least its bits; never decoded to 16 bits
        own = [m.TORCH_GGUF] if m.torch_gguf_weights(shape) is not None else []
        requant = eight + int4
        if shape.weight_bytes and shape.param_count:
            source_bpw = 8 * shape.weight_bytes / shape.param_count
            requant = [f for f in requant if m.TORCH_FORMAT_BPW[f] >= source_bpw - 0.01]
        # 16 bits only for a 16-bit file, or where no projection type of the file has a kernel (the reason says
        # which: explain.py): decoding 4.9 bits to 16 adds no quality, only bytes
        formats = [*own, *requant] if own else [half, *requant]
    else:
        formats = [half, *eight, *int4]
    return [f for f in formats if f in TORCH_ENGINE_RUNNABLE_FORMATS]


def _llama_quants(shape: ModelShape, prefs: Prefs) -> list[tuple[str, m.WeightLayout]]:
    if shape.quant:  # an existing GGUF: its own bytes
        exact = bool(shape.layer_bytes) and shape.weight_bytes is not None
        return [(shape.quant, m.weights(shape, None if exact else shape.quant))]
    if prefs.quant:
        return [(prefs.quant, m.weights(shape, prefs.quant))]
    ladder = m.QUANT_LADDER[: m.QUANT_LADDER.index(m.LOWEST_DEFAULT_QUANT) + 1]
    return [(q, m.weights(shape, q)) for q in ladder]


# The torch engine's weight formats by quality, best first (equal ranks: equal quality)
def _torch_gpu_sets(report: HardwareReport, shape: ModelShape, prefs: Prefs) -> list[tuple[tuple[int, ...], str]]:
    """GPU sets the torch engine runs on: one GPU; all of them when NVLink/P2P-joined (tensor parallelism, one
    rank per GPU), never a layer split.  --tensor-parallel N: the N GPUs with most budget, joined or not."""
    if prefs.tensor_parallel is not None and prefs.tensor_parallel > 1:
        usable = sorted(
            (g for g in report.gpus if m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib) > 0),
            key=lambda g: -m.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib),
        )
        if len(usable) < prefs.tensor_parallel or not shape_tp_ok(shape, prefs.tensor_parallel):
            return []
        return [(tuple(sorted(g.index for g in usable[: prefs.tensor_parallel])), "tensor")]
    return [
        (gpus, split)
        for gpus, split in _gpu_sets(report)
        if split != "layer"
        and len(gpus) <= TORCH_ENGINE_MAX_GPUS
        and (len(gpus) == 1 or prefs.tensor_parallel is None)
        and shape_tp_ok(shape, len(gpus))
    ]


def _torch_full(report, shape, prefs, lo, hi) -> list[Candidate]:
    """Each torch format that fits whole on GPUs, best quality first, on the fewest GPUs it fits (one, else all of
    them joined: bf16 over two joined cards is a candidate beside W8A16 on one, issue 19), at its best context."""
    if torch_engine_refusal(shape) or prefs.kv_cache_type not in (None, "f16"):
        return []
    options = []
    for order, (gpus, split) in enumerate(_torch_gpu_sets(report, shape, prefs)):
        for fmt in _torch_formats([g for g in report.gpus if g.index in gpus], shape, prefs):
            options.append((TORCH_QUALITY.get(fmt, 9), order, fmt, gpus, split))
    found: dict[str, Candidate] = {}
    for _, _, fmt, gpus, split in sorted(options, key=lambda o: o[:2]):
        if fmt in found:
            continue
        layout = m.weights(shape, fmt)

        def make(ctx: int, fmt: str = fmt, layout: m.WeightLayout = layout, gpus=gpus, split=split) -> Candidate:
            return Candidate("torch", fmt, layout, ctx, "f16", True, gpus, split, shape.n_layers, prefs.n_batch)

        ctx = best_ctx(report, shape, make, lo, hi)
        if ctx is not None:
            found[fmt] = make(ctx)
    return list(found.values())


def _tp_race(
    report: HardwareReport, shape: ModelShape, prefs: Prefs, lo: int, hi: int, quants, c: Candidate, tps: float
) -> str:
    """The reason a tensor-parallel torch plan gives: its estimate against llama.cpp's split of the same GPUs."""
    alt = _try_llama_full(report, shape, dataclasses.replace(prefs, backend="llama.cpp"), lo, hi, quants)
    alt_tps = expected_tokens_per_s(report, shape, alt, price(report, shape, alt)) if alt is not None else 0.0
    return tp_race_reason(c.gpus, c.quant, tps, alt and (alt.split_mode, alt.quant), alt_tps)


def _try_llama_full(report, shape, prefs, lo, hi, quants) -> Candidate | None:
    """The best quant of `quants` (best first) that fits whole on GPUs (the order of _llama_full)."""
    found = (_llama_full(report, shape, prefs, lo, hi, quant, layout) for quant, layout in quants)
    return next((c for c in found if c is not None), None)


def _llama_full(report, shape, prefs, lo, hi, quant, layout) -> Candidate | None:
    """llama.cpp with every layer on GPUs in `quant`: one GPU, else all; an f16 KV cache at the largest context
    down to the minimum, then a q8_0 and a q4_0 one; None when none fits."""
    kvs = (prefs.kv_cache_type,) if prefs.kv_cache_type else KV_LADDER
    for gpus, split in _gpu_sets(report):
        for kv in kvs:

            def make(ctx: int, kv: str = kv, gpus=gpus, split=split) -> Candidate:
                return Candidate("llama.cpp", quant, layout, ctx, kv, True, gpus, split, shape.n_layers, prefs.n_batch)

            ctx = best_ctx(report, shape, make, lo, hi)
            if ctx is not None:
                return make(ctx)
    return None


def _full_gpu_race(report, shape, prefs, lo, hi, quants, torch_ok: bool, llama_ok: bool):
    """The speed race (hwprobe.race) among everything that fits whole on GPUs: each torch format (_torch_full) and
    each llama.cpp quant (_llama_full); None when nothing fits.  Returns (chosen, candidate summaries, reason)."""
    cands = _torch_full(report, shape, prefs, lo, hi) if torch_ok and prefs.backend in ("auto", "torch") else []
    if llama_ok and prefs.backend in ("auto", "llama.cpp"):
        cands += [c for q, layout in quants if (c := _llama_full(report, shape, prefs, lo, hi, q, layout))]
    if not cands:
        return None
    entries = [race.entry(report, shape, c, prefs, serving(prefs)) for c in cands]
    win = race.winner(entries, serving(prefs), hi)
    why = race.race_reason(entries, win, serving(prefs), prefs.max_ppl_increase_pct) if len(entries) > 1 else None
    return win.candidate, race.summaries(entries, win), why


def _partial(report, shape, prefs, lo, quants) -> Candidate:
    quant, layout = quants[-1]
    kv = prefs.kv_cache_type or "f16"
    best: Candidate | None = None
    for gpus, split in _gpu_sets(report):
        split = "layer" if len(gpus) > 1 else "none"  # a partial offload splits by layer

        def make(n: int, gpus: tuple[int, ...] = gpus, split: str = split) -> Candidate:
            return Candidate("llama.cpp", quant, layout, lo, kv, True, gpus, split, n, prefs.n_batch)

        c = most_layers(report, shape, make)
        if c is not None and (best is None or c.n_gpu_layers > best.n_gpu_layers):
            best = c
    return best or Candidate("llama.cpp", quant, layout, lo, kv, kv != "f16", (), "none", 0, prefs.n_batch)


def _torch_offload(report, shape, prefs, lo, hi, n_fixed=None) -> Candidate | None:
    """The torch engine on one GPU streaming its first blocks from pinned host RAM (backends/torch_engine/
    offload.py), or None where it cannot run the model there (what _torch_full checks) or nothing fits.

    Per format of `_torch_formats`, the most resident blocks that fit at context lo, the context llama.cpp's
    partial offload is planned at, so the two race on equal terms; n_fixed (the user's --n-gpu-layers): those
    blocks, at the largest context in [lo, hi] that fits (else lo, and the plan says what is over).  Of these the
    fastest by torch_offload_tokens_per_s wins, quality order breaking ties, rather than the best format, as
    _partial takes the ladder's lowest quant: every streamed block crosses the bus once a token, so bf16 decodes
    at about half W8A16's speed for no measurable quality (starter perplexity 14.76 bf16, 14.72 W8A16)."""
    if torch_engine_refusal(shape) or prefs.kv_cache_type not in (None, "f16") or shape.n_layers < 2:
        return None
    gpus = next((g for g, _ in _gpu_sets(report)), ())  # the GPU with most budget: the engine runs on one
    best, best_key = None, None
    for fmt in _torch_formats([g for g in report.gpus if g.index in gpus], shape, prefs):
        layout = m.weights(shape, fmt)

        def make(n: int, ctx: int = lo, fmt: str = fmt, layout: m.WeightLayout = layout) -> Candidate:
            return Candidate("torch", fmt, layout, ctx, "f16", True, gpus, "none", n, prefs.n_batch)

        if n_fixed is None:
            c = most_layers(report, shape, make)
        else:
            c = make(n_fixed, best_ctx(report, shape, lambda ctx: make(n_fixed, ctx), lo, hi) or lo)
        if c is None:
            continue
        key = (fits(report, shape, c), torch_offload_tokens_per_s(report, shape, c))
        if best_key is None or key > best_key:
            best, best_key = c, key
    return best


def _expert_placement(report, shape, prefs, lo, quants) -> Candidate | None:
    """llama.cpp on the GPU with most budget holding every layer but the routed experts of the first k blocks,
    for the fewest k (1 <= k <= n_layers) that fits, at the quant and context _partial plans with; None for a
    dense model or when even every expert in host RAM does not fit."""
    if not shape.n_experts or not shape.n_experts_used:
        return None
    gpus = next((g for g, _ in _gpu_sets(report)), ())
    if not gpus:
        return None
    quant, layout = quants[-1]
    kv = prefs.kv_cache_type or "f16"

    def make(k: int) -> Candidate:
        return Candidate(
            "llama.cpp", quant, layout, lo, kv, True, gpus, "none", shape.n_layers, prefs.n_batch, cpu_expert_layers=k
        )

    # on the GPU: monotone in the layers whose experts stay there (n_layers - k)
    on_gpu = largest(0, shape.n_layers - 1, lambda j: fits_gpus(report, shape, make(shape.n_layers - j)))
    if on_gpu is None or not fits(report, shape, make(shape.n_layers - on_gpu)):
        return None
    return make(shape.n_layers - on_gpu)


def _score(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[bool, float]:
    return fits(report, shape, c), expected_tokens_per_s(report, shape, c, price(report, shape, c))


def _faster(
    report: HardwareReport, shape: ModelShape, llama: Candidate, streamed: Candidate | None, *, batching: bool = False
) -> tuple[Candidate, tuple[Candidate, float] | None]:
    """The faster of llama.cpp's partial offload and the torch engine streaming blocks (a candidate that does
    not fit loses to one that does; a tie goes to llama.cpp), and the loser with its tokens/s for the reasons.
    `batching` (serving): the torch engine wins whenever it fits, since each step streams the blocks once for
    every request in the batch while llama.cpp answers one request at a time."""
    if streamed is None:
        return llama, None

    by_llama, by_torch = _score(report, shape, llama), _score(report, shape, streamed)
    if by_torch > by_llama or (batching and by_torch[0]):
        return streamed, (llama, by_llama[1])
    return llama, (streamed, by_torch[1])


def _with_flags(report: HardwareReport, shape: ModelShape, prefs: Prefs, c: Candidate) -> Candidate:
    """Apply a user-given n_gpu_layers (the plan then reports what it costs, fit or not)."""
    if prefs.n_gpu_layers is None:
        return c
    n = shape.n_layers if prefs.n_gpu_layers < 0 else min(prefs.n_gpu_layers, shape.n_layers)
    gpus = c.gpus or next((g for g, _ in _gpu_sets(report)), ())
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
    quants = _llama_quants(shape, prefs)
    file_format = shape.extra.get("file_format") if shape.extra else None
    chosen: Candidate | None = None
    rival: tuple[Candidate, float] | None = None  # the partial offload that lost the race (step 3)
    expert_race: tuple[Candidate, float, Candidate, float] | None = None  # (experts, tps, layer offload, tps)
    tp_asked = prefs.tensor_parallel is not None and prefs.tensor_parallel > 1
    raced: tuple[PlanCandidate, ...] = ()  # what the speed race weighed (hwprobe.race), the chosen one marked
    race_why: str | None = None
    found = _full_gpu_race(
        report,
        shape,
        prefs,
        lo,
        hi,
        quants,
        torch_ok=prefs.n_gpu_layers in (None, -1, shape.n_layers),
        llama_ok=file_format != "safetensors" and not tp_asked,
    )
    if found is not None:
        chosen, raced, race_why = found
    fixed = prefs.n_gpu_layers if prefs.n_gpu_layers is not None and 0 < prefs.n_gpu_layers < shape.n_layers else None
    torch_only = prefs.backend == "torch" or (prefs.backend == "auto" and file_format == "safetensors")
    if chosen is None and torch_only and (prefs.n_gpu_layers is None or fixed is not None):
        chosen = _torch_offload(report, shape, prefs, lo, hi, fixed)
    if tp_asked and chosen is None:
        if report.gpus:
            raise no_tp_error(report, shape, prefs.tensor_parallel)  # type: ignore[arg-type]
        chosen = _torch_cpu(report, shape, prefs, lo, hi)  # ranks on the CPU's cores (tests, CI)
    if chosen is None and prefs.backend == "torch" or (chosen is None and file_format == "safetensors"):
        chosen = _torch_cpu(report, shape, prefs, lo, hi)
    single: tuple[Candidate, float] | None = None  # serving: the one-at-a-time plan the batching one replaced
    if chosen is None:  # nothing fits whole on the GPUs (the race above tried every llama.cpp quant too)
        chosen = _partial(report, shape, prefs, lo, quants)
        if not chosen.gpus:  # CPU only: RAM is cheap, so the best quant at the target context if it fits
            chosen = _cpu_only(report, shape, prefs, lo, hi, quants) or chosen
        if prefs.backend == "auto" and prefs.n_gpu_layers is None:
            chosen, rival = _faster(
                report, shape, chosen, _torch_offload(report, shape, prefs, lo, hi), batching=serving(prefs)
            )
            if not chosen.gpus and serving(prefs):
                chosen, single = _serve_on_cpu(report, shape, prefs, lo, hi, chosen)
        # serving keeps the batching torch engine it chose; expert placement races llama.cpp's plans
        experts = (
            _expert_placement(report, shape, prefs, lo, quants)
            if chosen.gpus
            and prefs.backend in ("auto", "llama.cpp")
            and prefs.n_gpu_layers is None
            and not (serving(prefs) and chosen.backend == "torch")
            else None
        )
        if experts is not None:
            by_experts, by_layers = _score(report, shape, experts), _score(report, shape, chosen)
            expert_race = (experts, by_experts[1], chosen, by_layers[1])
            if by_experts > by_layers:
                chosen, rival = experts, None
    chosen = _with_flags(report, shape, prefs, chosen)
    if chosen.backend == "torch":  # fitting needed one sequence; the pool takes up to max_num_seqs
        chosen = dataclasses.replace(chosen, max_num_seqs=prefs.max_num_seqs)
    devices = price(report, shape, chosen)
    if prefs.n_gpu_layers is None and not all(d.headroom_mib >= 0 for d in devices):
        raise _no_fit(report, shape, chosen, devices)
    from hwprobe.explain import reasons  # lazy: keeps `hearth --help` light (+1 hearth modules)

    share = shares(report, chosen.gpus)
    split = tuple(round(share.get(g.index, 0.0), 3) for g in report.gpus) if len(chosen.gpus) > 1 else ()
    main = (
        chosen.gpus[0]
        if chosen.split_mode == "tensor" or len(chosen.gpus) == 1
        else (chosen.gpus[-1] if chosen.gpus else 0)
    )
    device = "cpu" if not chosen.gpus else ("cuda" if len(chosen.gpus) > 1 else f"cuda:{chosen.gpus[0]}")
    final = race.entry(report, shape, chosen, prefs, serving(prefs), devices)
    tps = final.tokens_per_s
    if raced and prefs.n_gpu_layers in (None, -1, shape.n_layers):
        candidates = raced
    else:  # no race, or the flags changed what it chose: the plan as it is
        candidates = (dataclasses.replace(final.summary, chosen=True),)
    tried = _torch_tried(report, shape, prefs, chosen)
    why = reasons(report, shape, prefs, chosen, devices, tps, quants, tried, rival, expert_race, single, raced)
    if race_why is not None:
        why = (*why, race_why)
    tensor_parallel = 1
    if chosen.backend == "torch" and chosen.split_mode == "tensor" and len(chosen.gpus) > 1:
        tensor_parallel = len(chosen.gpus)
        why = (*why, _tp_race(report, shape, prefs, lo, hi, quants, chosen, tps))
    elif chosen.backend == "torch" and not chosen.gpus and prefs.tensor_parallel:  # CPU ranks, asked for
        tensor_parallel = prefs.tensor_parallel
        if tensor_parallel > 1:
            why = (
                *why,
                f"tensor parallel: {tensor_parallel} ranks share the CPU's {report.cpu_cores} cores, each "
                "holding its share of the weights and of the KV pool's heads (a rank reads the whole file "
                "while loading); on a CPU this checks the split, it is slower than one rank",
            )
    pool = _kv_pool_bytes(shape, chosen, devices, tensor_parallel)
    one_gpu = chosen.backend == "torch" and len(chosen.gpus) == 1 and tensor_parallel == 1
    devices, swap, swap_reason = with_swap_space(shape, chosen.kv_cache_type, pool if one_gpu else 0, devices)
    if swap_reason is not None:
        why = (*why, swap_reason)
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
        candidates=candidates,
        expected_aggregate_tokens_per_s=final.aggregate,
    )


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
    formats = _torch_formats([g for g in report.gpus if g.index in c.gpus], shape, prefs)
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


def _cpu_only(report, shape, prefs, lo, hi, quants) -> Candidate | None:
    kv = prefs.kv_cache_type or "f16"
    for quant, layout in quants:

        def make(ctx: int, quant: str = quant, layout: m.WeightLayout = layout) -> Candidate:
            return Candidate("llama.cpp", quant, layout, ctx, kv, kv != "f16", (), "none", 0, prefs.n_batch)

        ctx = best_ctx(report, shape, make, lo, hi)
        if ctx is not None:
            return make(ctx)
    return None


def serving(prefs: Prefs) -> bool:
    """Concurrent clients are expected (`hearth serve`, more than one at once) and the backend is the plan's."""
    return prefs.prefer_batching and prefs.backend == "auto" and prefs.max_num_seqs > 1


def _serve_on_cpu(
    report,
    shape,
    prefs,
    lo,
    hi,
    llama: Candidate,
) -> tuple[Candidate, tuple[Candidate, float] | None]:
    """Serving from host RAM: the torch engine (continuous batching) instead of llama.cpp's one request at a
    time, where it runs the model and its batch's KV pool fits RAM; else llama.cpp.  Returns the chosen plan and
    llama.cpp's single-stream candidate with its tokens/s (for the reasons), or None when llama.cpp stays."""
    if torch_engine_refusal(shape) is not None:
        return llama, None
    torch = _torch_cpu(report, shape, prefs, lo, hi)
    if not fits(report, shape, torch):
        return llama, None
    return torch, (llama, expected_tokens_per_s(report, shape, llama, price(report, shape, llama)))


def _torch_cpu(report, shape, prefs, lo, hi) -> Candidate:
    """The torch engine on the CPU, in the weights model_runner resolves there: bf16 compute where the CPU has
    AVX-512 (its bf16 matmuls), keeping a GGUF's 4-bit blocks when it has some ("GGUF"), else dense bf16;
    float32 without AVX-512, with a float32 KV cache (on the CPU the cache follows the compute dtype).  The
    largest context in [lo, hi] whose one sequence fits (else hi, and the plan says what is over)."""
    if report.cpu_avx512:
        fmt = m.TORCH_GGUF if m.torch_gguf_weights(shape) is not None else "bf16"
    else:
        fmt = "fp32"
    kv = "f32" if fmt == "fp32" else "f16"
    layout = m.torch_cpu_weights(shape, fmt, report.ram_total_mib * m.MIB)

    def make(ctx: int) -> Candidate:  # a full decode batch's gathered KV is priced from the start
        return Candidate("torch", fmt, layout, ctx, kv, False, (), "none", 0, prefs.n_batch, prefs.max_num_seqs)

    return make(prefs.ctx or best_ctx(report, shape, make, lo, hi) or hi)


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
