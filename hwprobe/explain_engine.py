"""The plan's reasons about its engine: which one runs the model and why, and what its weights are.

Split from hwprobe/explain.py, which assembles every reason of a plan (hwprobe.explain.reasons).
"""

from __future__ import annotations

from hwprobe import memory as m
from hwprobe.placement import Candidate
from hwprobe.plan_types import PlanCandidate, Prefs
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.support import torch_engine_refusal


def gib(mib_value: float) -> str:
    return f"{mib_value / 1024:.1f} GiB"


# What each torch-engine weight format is, for the reasons (quality first: see hwprobe.candidates.torch_formats).
_TORCH_FORMAT_WHAT = {
    "bf16": "bf16, the file's weights at full quality",
    "fp16": "fp16, the file's weights at full quality",
    "W8A16": "W8A16 (int8 per output channel, quantized while loading; +0.2 % perplexity on the starter)",
    "FP8": "FP8 (e4m3 per output channel, quantized while loading)",
    "W4A16+attn8": (
        "W4A16+attn8 (precision per layer: attention projections int8 per output channel, MLP int4 in groups of "
        "128, round-to-nearest while loading; +9.4 % perplexity on the starter, W4A16 +12 %)"
    ),
    "W4A16": "W4A16 (int4 in groups of 128, round-to-nearest while loading: expect a clear quality loss)",
}


def _torch_weights(shape: ModelShape, c: Candidate, tried: tuple[str, ...]) -> str:
    """One sentence: the torch format chosen, what it is, and which better ones did not fit."""
    quantized_file = shape.quant is not None and shape.quant not in ("F32", "F16", "BF16")
    if c.quant in ("bf16", "fp16") and quantized_file:  # only where no projection type has a kernel (planner)
        no_kernel = ", ".join(_unkept(shape)) or shape.quant
        what = (
            f"{c.quant}, decoded to 16 bits: no kernel for {no_kernel} (the file's {shape.quant} values, 16-bit bytes)"
        )
    elif c.quant == m.TORCH_GGUF:
        what = (
            f"GGUF, the file's own {shape.quant} blocks repacked for the engine's kernels (the weights llama.cpp "
            "runs, Q6_K as it is; Q5_K and the rest without a layout of their own within half an int8 level): "
            + _kept_projections(shape, gpu=True)
        )
    elif c.quant == m.checkpoint_label(shape):
        what = _checkpoint_what(c.quant)
    else:
        what = _TORCH_FORMAT_WHAT.get(c.quant, c.quant)
    sizes = ", ".join(f"{f} {m.weights(shape, f).total_bytes / 2**30:.1f} GiB" for f in tried)
    return f"weights {what}" + (f"; better formats do not fit ({sizes})" if tried else "")


def _kept_projections(shape: ModelShape, gpu: bool = False) -> str:
    """Which share of the projections a TORCH_GGUF load keeps as int4, int8 and (on a GPU) q6 blocks, and what is
    left dense."""
    int4, int8 = m.gguf_repacked_shares(shape)
    q6 = sum(m.gguf_q6_params(shape)) / max(m.projection_params(shape) * shape.n_layers, 1) if gpu else 0.0
    kept = " and ".join(
        f"{100 * share:.0f} % as {kind}"
        for share, kind in (
            (int4, "int4 (5.0 bits)"),
            (int8 - q6, "int8 (8.5 bits)"),
            (q6, "q6 (6.56 bits, Q6_K as it is)"),
        )
        if share > 1e-9
    )
    unkept = _unkept(shape)
    dense = (
        ""
        if int4 + int8 > 0.999
        else f", the rest decoded to 16 bits: no kernel for {', '.join(unkept)}"
        if unkept
        else ", the rest 16-bit as in the file"
    )
    return f"projections {kept}{dense}"


def _unkept(shape: ModelShape) -> tuple[str, ...]:
    """The file's projection types without a kernel of the engine's (decoded to 16 bits)."""
    return tuple(shape.extra.get("gguf_unkept_types", ())) if shape.extra else ()


def backend_reasons(
    report: HardwareReport,
    shape: ModelShape,
    prefs: Prefs,
    c: Candidate,
    torch_tried: tuple[str, ...],
    single: tuple[Candidate, float] | None,
    offload: bool,
    raced: tuple[PlanCandidate, ...] = (),
) -> list[str]:
    """Which engine runs the model and why, and what its weights are (hwprobe.explain.reasons()'s arguments)."""
    if offload:
        return _streaming_backend(shape, prefs, c, torch_tried)
    if c.backend == "torch":
        return _torch_backend(report, shape, prefs, c, torch_tried, single)
    return [_llama_backend(report, shape, prefs, raced)]


def _streaming_backend(shape: ModelShape, prefs: Prefs, c: Candidate, torch_tried: tuple[str, ...]) -> list[str]:
    """The torch engine streaming blocks from host RAM: the blocks asked for (--n-gpu-layers), or because none
    of its formats fits whole; and its weights."""
    streamed = shape.n_layers - c.n_gpu_layers
    if prefs.n_gpu_layers is not None:
        why = "asked for" if prefs.backend == "torch" else "safetensors weights"
        backend = (
            f"backend torch ({why}): "
            f"{c.n_gpu_layers} blocks resident on GPU {c.gpus[0]} (--n-gpu-layers), the first "
            f"{streamed} streamed from pinned host RAM"
        )
    else:
        sizes = ", ".join(f"{f} {m.weights(shape, f).total_bytes / 2**30:.1f} GiB" for f in torch_tried)
        backend = (
            f"backend torch: the torch engine supports {shape.architecture} but none of its formats "
            f"fits entirely on GPU {c.gpus[0]} ({sizes}), so it streams the first {streamed} layers "
            f"from pinned host RAM, in {c.quant}, the format that streams fastest"
        )
    return [backend, _torch_weights(shape, c, ())]


def _torch_backend(
    report: HardwareReport,
    shape: ModelShape,
    prefs: Prefs,
    c: Candidate,
    torch_tried: tuple[str, ...],
    single: tuple[Candidate, float] | None,
) -> list[str]:
    """The torch engine whole on GPUs or on the CPU, and why; and its weights."""
    where = "CPU" if not c.gpus else ", ".join(f"GPU {i}" for i in c.gpus)
    why = "the torch engine supports" if torch_engine_refusal(shape) is None else "asked for"
    out = [
        f"backend torch: {why} {shape.architecture} and the {c.quant} weights fit entirely on {where}"
        if c.gpus
        else f"backend torch on CPU ({c.quant}): "
        + (
            "asked for"
            if prefs.backend == "torch"
            else "batching concurrent requests for serve"
            if single is not None
            else "safetensors weights"
        )
    ]
    if c.gpus:
        out.append(_torch_weights(shape, c, torch_tried))
    elif c.quant == m.TORCH_GGUF:
        out.append(_cpu_gguf_weights(report, shape, c))
    elif c.quant == m.checkpoint_label(shape):
        out.append(f"weights {_checkpoint_what(c.quant)}")
    return out


def _checkpoint_what(label: str) -> str:
    """A GPTQ / AWQ folder's weights, for the reasons."""
    return (
        f"{label}, the folder's own packed integers (never decoded to 16 bits nor quantized again: the torch engine "
        "runs them with its int4 / int8 kernels; llama.cpp reads GGUF only)"
    )


def _cpu_gguf_weights(report: HardwareReport, shape: ModelShape, c: Candidate) -> str:
    """One sentence: a GGUF's own blocks kept for the torch engine's CPU kernels, and its dense prompt copies."""
    copies = c.layout.prefill_copy_bytes
    return (
        f"weights: the file's own {shape.quant} blocks repacked for torch's CPU kernels, "
        + _kept_projections(shape)
        + (
            f", plus bf16 copies of them for prompt rows ({gib(copies / m.MIB)})"
            if copies
            else " (no dense copies for prompt rows: they would pass "
            f"{gib(m.torch_cpu_dense_copy_budget(report.ram_total_mib * m.MIB) / m.MIB)})"
        )
    )


def _llama_backend(report: HardwareReport, shape: ModelShape, prefs: Prefs, raced: tuple[PlanCandidate, ...]) -> str:
    """Why llama.cpp runs the model: the torch engine cannot, lost the race, does not fit, or was not asked for."""
    refusal = torch_engine_refusal(shape)
    if refusal and prefs.backend != "llama.cpp":
        return f"backend llama.cpp: {refusal}"
    if any(r.backend == "torch" for r in raced):
        return (
            f"backend llama.cpp: the torch engine runs {shape.architecture} too and fits, but llama.cpp is "
            "the faster within the quality budget (engine race below)"
        )
    if report.gpus and prefs.backend == "auto":
        return (
            "backend llama.cpp: the torch engine's formats do not fit entirely in VRAM"
            " (or the GPU is too old / of unknown compute capability)"
        )
    if prefs.backend == "llama.cpp":
        return "backend llama.cpp (asked for)"
    # which engine runs what: the torch engine could, llama.cpp is the faster single stream on CPU
    return (
        f"backend llama.cpp (CPU): faster for one stream on a CPU; the torch engine runs "
        f"{shape.architecture} too (--backend torch, or hearth serve, which batches requests)"
    )
