"""What each engine could run on this machine: the candidates the planner (hwprobe/planner.py) weighs.

Each builder proposes configurations of one kind, sized by the fit searches (hwprobe.fit_search): the torch
engine's weight formats whole on the fewest GPUs (`torch_full`), llama.cpp's quants whole on GPUs
(`llama_full`), llama.cpp's partial offload (`llama_partial`), the torch engine streaming blocks from host RAM
(`torch_offload`), a mixture-of-experts model's routed experts in host RAM (`expert_placement`), and the CPU-only
plans of both engines (`llama_cpu`, `torch_cpu`).  A GPTQ / AWQ folder (hwprobe.memory.checkpoint_label) is
planned in its own format only, on one GPU or the CPU: the torch engine runs nothing else of it, llama.cpp
none.  Split from hwprobe/planner.py, which races them and decides; these only propose and size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hwprobe import memory as m
from hwprobe.fit_search import best_ctx, fits, fits_gpus, largest, most_layers
from hwprobe.placement import Candidate, torch_offload_tokens_per_s
from hwprobe.plan_types import Prefs
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
from hwprobe.tensor_parallel import TORCH_QUALITY, shape_tp_ok

KV_LADDER = ("f16", "q8_0", "q4_0")


def gpu_sets(report: HardwareReport) -> Iterator[tuple[tuple[int, ...], str]]:
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


def torch_formats(gpus: Iterable[GpuInfo], shape: ModelShape, prefs: Prefs) -> list[str]:
    """The torch engine's weight formats for these GPUs, best quality first (hwprobe.planner's docstring, step 1; the
    race then weighs them by speed within the quality budget).

    W8A16 before FP8: the same bytes, and int8 per channel keeps more of the weights than e4m3 (measured on the
    starter, 1024 tokens of tests/data/english.txt: perplexity 14.76 dense, 14.72 W8A16, 14.98 FP8), and the
    weight-only FP8 kernel reads as many bytes and widens them to 16 bits for its matmul, so it should be no
    faster (not measured: no GPU yet).

    W4A16+attn8 (memory.TORCH_MIXED: attention projections W8A16, MLP W4A16) wherever W4A16 is, before it: more
    bytes, less loss (starter perplexity +15 % against W4A16's +34 %, hwprobe.quality).  For a GGUF source each
    format's lowest bits count (its MLP's 4.25 for the mixed one), so it is never below the file's own bits."""
    return _formats([g.cc for g in gpus], shape, prefs)


def quantized_formats(shape: ModelShape, prefs: Prefs) -> list[str]:
    """The formats quantized while loading that the planner may offer for `shape` on a GPU that runs them all
    (compute capability 8.9: FP8 too), best quality first: what `hearth ppl --compare-formats` measures against
    the model's best format (its 16 bits, or a GGUF's own blocks), which is left out, as is a GPTQ / AWQ label."""
    own = {"bf16", "fp16", m.TORCH_GGUF, m.checkpoint_label(shape)}
    return [f for f in _formats([FP8_MIN_CC], shape, prefs) if f not in own]


def _formats(ccs: list, shape: ModelShape, prefs: Prefs) -> list[str]:
    if not ccs or any(cc is None or cc < TORCH_ENGINE_MIN_CC for cc in ccs):
        return []
    if (label := m.checkpoint_label(shape)) is not None:  # GPTQ / AWQ: its own packed weights, nothing else
        return [label]
    half = "bf16" if all(cc >= BF16_MIN_CC for cc in ccs) else "fp16"  # type: ignore[operator]
    eight = ["W8A16"] + (["FP8"] if all(cc >= FP8_MIN_CC for cc in ccs) else [])  # type: ignore[operator]
    # W4A16 only where llama.cpp cannot run a better 4-bit file instead (see hwprobe.planner's docstring)
    four = prefs.backend == "torch" or (shape.extra or {}).get("file_format") == "safetensors"
    int4 = [m.TORCH_MIXED, "W4A16"] if four else []
    if shape.quant:  # a GGUF source: its own blocks, or a format of at least its bits; never decoded to 16 bits
        own = [m.TORCH_GGUF] if m.torch_gguf_weights(shape) is not None else []
        requant = eight + int4
        if shape.weight_bytes and shape.param_count:
            source_bpw = 8 * shape.weight_bytes / shape.param_count
            requant = [f for f in requant if m.torch_format_lowest_bpw(f) >= source_bpw - 0.01]
        # 16 bits only for a 16-bit file, or where no projection type of the file has a kernel (the reason says
        # which: explain_engine.py): decoding 4.9 bits to 16 adds no quality, only bytes
        formats = [*own, *requant] if own else [half, *requant]
    else:
        formats = [half, *eight, *int4]
    return [f for f in formats if f in TORCH_ENGINE_RUNNABLE_FORMATS]


def llama_quants(shape: ModelShape, prefs: Prefs) -> list[tuple[str, m.WeightLayout]]:
    if shape.quant:  # an existing GGUF: its own bytes
        exact = bool(shape.layer_bytes) and shape.weight_bytes is not None
        return [(shape.quant, m.weights(shape, None if exact else shape.quant))]
    if prefs.quant:
        return [(prefs.quant, m.weights(shape, prefs.quant))]
    ladder = m.QUANT_LADDER[: m.QUANT_LADDER.index(m.LOWEST_DEFAULT_QUANT) + 1]
    return [(q, m.weights(shape, q)) for q in ladder]


# The torch engine's weight formats by quality, best first (equal ranks: equal quality)
def torch_gpu_sets(report: HardwareReport, shape: ModelShape, prefs: Prefs) -> list[tuple[tuple[int, ...], str]]:
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
    one_gpu = m.checkpoint_label(shape) is not None  # the loader splits no GPTQ / AWQ checkpoint over GPUs yet
    return [
        (gpus, split)
        for gpus, split in gpu_sets(report)
        if split != "layer"
        and (len(gpus) == 1 or not one_gpu)
        and len(gpus) <= TORCH_ENGINE_MAX_GPUS
        and (len(gpus) == 1 or prefs.tensor_parallel is None)
        and shape_tp_ok(shape, len(gpus))
    ]


def torch_full(report, shape, prefs, lo, hi) -> list[Candidate]:
    """Each torch format that fits whole on GPUs, best quality first, on the fewest GPUs it fits (one, else all of
    them joined: bf16 over two joined cards is a candidate beside W8A16 on one, issue 19), at its best context."""
    if torch_engine_refusal(shape) or prefs.kv_cache_type not in (None, "f16"):
        return []
    options = []
    for order, (gpus, split) in enumerate(torch_gpu_sets(report, shape, prefs)):
        for fmt in torch_formats([g for g in report.gpus if g.index in gpus], shape, prefs):
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


def try_llama_full(report, shape, prefs, lo, hi, quants) -> Candidate | None:
    """The best quant of `quants` (best first) that fits whole on GPUs (the order of llama_full)."""
    found = (llama_full(report, shape, prefs, lo, hi, quant, layout) for quant, layout in quants)
    return next((c for c in found if c is not None), None)


def llama_full(report, shape, prefs, lo, hi, quant, layout) -> Candidate | None:
    """llama.cpp with every layer on GPUs in `quant`: one GPU, else all; an f16 KV cache at the largest context
    down to the minimum, then a q8_0 and a q4_0 one; None when none fits."""
    kvs = (prefs.kv_cache_type,) if prefs.kv_cache_type else KV_LADDER
    for gpus, split in gpu_sets(report):
        for kv in kvs:

            def make(ctx: int, kv: str = kv, gpus=gpus, split=split) -> Candidate:
                return Candidate("llama.cpp", quant, layout, ctx, kv, True, gpus, split, shape.n_layers, prefs.n_batch)

            ctx = best_ctx(report, shape, make, lo, hi)
            if ctx is not None:
                return make(ctx)
    return None


def llama_partial(report, shape, prefs, lo, quants) -> Candidate:
    quant, layout = quants[-1]
    kv = prefs.kv_cache_type or "f16"
    best: Candidate | None = None
    for gpus, split in gpu_sets(report):
        split = "layer" if len(gpus) > 1 else "none"  # a partial offload splits by layer

        def make(n: int, gpus: tuple[int, ...] = gpus, split: str = split) -> Candidate:
            return Candidate("llama.cpp", quant, layout, lo, kv, True, gpus, split, n, prefs.n_batch)

        c = most_layers(report, shape, make)
        if c is not None and (best is None or c.n_gpu_layers > best.n_gpu_layers):
            best = c
    return best or Candidate("llama.cpp", quant, layout, lo, kv, kv != "f16", (), "none", 0, prefs.n_batch)


def torch_offload(report, shape, prefs, lo, hi, n_fixed=None) -> Candidate | None:
    """The torch engine on one GPU streaming its first blocks from pinned host RAM (backends/torch_engine/
    offload.py), or None where it cannot run the model there (what torch_full checks) or nothing fits.

    Per format of `torch_formats`, the most resident blocks that fit at context lo, the context llama.cpp's
    partial offload is planned at, so the two race on equal terms; n_fixed (the user's --n-gpu-layers): those
    blocks, at the largest context in [lo, hi] that fits (else lo, and the plan says what is over).  Of these the
    fastest by torch_offload_tokens_per_s wins, quality order breaking ties, rather than the best format, as
    llama_partial takes the ladder's lowest quant: every streamed block crosses the bus once a token, so bf16 decodes
    at about half W8A16's speed for no measurable quality (starter perplexity 14.76 bf16, 14.72 W8A16)."""
    if torch_engine_refusal(shape) or prefs.kv_cache_type not in (None, "f16") or shape.n_layers < 2:
        return None
    gpus = next((g for g, _ in gpu_sets(report)), ())  # the GPU with most budget: the engine runs on one
    best, best_key = None, None
    for fmt in torch_formats([g for g in report.gpus if g.index in gpus], shape, prefs):
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


def expert_placement(report, shape, prefs, lo, quants) -> Candidate | None:
    """llama.cpp on the GPU with most budget holding every layer but the routed experts of the first k blocks,
    for the fewest k (1 <= k <= n_layers) that fits, at the quant and context llama_partial plans with; None for a
    dense model or when even every expert in host RAM does not fit."""
    if not shape.n_experts or not shape.n_experts_used:
        return None
    gpus = next((g for g, _ in gpu_sets(report)), ())
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


def llama_cpu(report, shape, prefs, lo, hi, quants) -> Candidate | None:
    kv = prefs.kv_cache_type or "f16"
    for quant, layout in quants:

        def make(ctx: int, quant: str = quant, layout: m.WeightLayout = layout) -> Candidate:
            return Candidate("llama.cpp", quant, layout, ctx, kv, kv != "f16", (), "none", 0, prefs.n_batch)

        ctx = best_ctx(report, shape, make, lo, hi)
        if ctx is not None:
            return make(ctx)
    return None


def torch_cpu(report, shape, prefs, lo, hi) -> Candidate:
    """The torch engine on the CPU, in the weights model_runner resolves there: bf16 compute where the CPU has
    AVX-512 (its bf16 matmuls), keeping a GGUF's 4-bit blocks when it has some ("GGUF"), else dense bf16;
    float32 without AVX-512, with a float32 KV cache (on the CPU the cache follows the compute dtype).  The
    largest context in [lo, hi] whose one sequence fits (else hi, and the plan says what is over)."""
    if report.cpu_avx512:
        fmt = m.TORCH_GGUF if m.torch_gguf_weights(shape) is not None else "bf16"
    else:
        fmt = "fp32"
    kv = "f32" if fmt == "fp32" else "f16"
    fmt = m.checkpoint_label(shape) or fmt  # a GPTQ / AWQ folder keeps its packed weights in either dtype
    layout = m.torch_cpu_weights(shape, fmt, report.ram_total_mib * m.MIB, bf16=kv != "f32")

    def make(ctx: int) -> Candidate:  # a full decode batch's gathered KV is priced from the start
        return Candidate("torch", fmt, layout, ctx, kv, False, (), "none", 0, prefs.n_batch, prefs.max_num_seqs)

    return make(prefs.ctx or best_ctx(report, shape, make, lo, hi) or hi)
