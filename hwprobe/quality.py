"""Quality-loss rules shared by `hearth ppl --compare` and the planner (pure stdlib: hwprobe imports no app)."""

from __future__ import annotations

from dataclasses import dataclass

# Perplexity increase above which generation quality may suffer noticeably: an absolute 2 points, or 5% of the
# base perplexity, whichever is hit first.
DELTA_PPL_ABS_LIMIT = 2.0
DELTA_PPL_REL_LIMIT = 0.05


def delta_ppl_warning(base_ppl: float, other_ppl: float) -> str | None:
    """A one-line warning when `other_ppl` is worse than `base_ppl` by more than 2 or by more than 5% of the
    base; None when the loss is within both limits."""
    delta = other_ppl - base_ppl
    if delta > DELTA_PPL_ABS_LIMIT or delta > DELTA_PPL_REL_LIMIT * base_ppl:
        return (
            f"perplexity rises by {delta:.3f} ({100 * delta / base_ppl:.1f}% of {base_ppl:.3f}): "
            f"above the limit of {DELTA_PPL_ABS_LIMIT:g} or {100 * DELTA_PPL_REL_LIMIT:g}%, "
            "generation quality may suffer noticeably"
        )
    return None


# ---- the quality a weight format costs, for the planner's budget (`--max-ppl-increase`) -------------------------

DEFAULT_MAX_PPL_INCREASE_PCT = 1.0  # the plan's default budget: formats within 1 % of the best one's perplexity

_LLAMA_CPP_SCOREBOARD = (
    "llama.cpp's tools/perplexity README, LLaMA 3 8B scoreboard (Wikitext-2, F16 perplexity 6.2332; the copy "
    "vendored in llama-cpp-python 0.3.36)"
)
_STARTER = "hearth's measurement on the starter (SmolLM2-135M), docs/torch-engine.md 'Conformance'"
# llama.cpp's quant types (file types) against F16 of the same model, % of perplexity
LLAMA_CPP_PPL_INCREASE_PCT = {
    "F32": 0.0,
    "F16": 0.0,
    "BF16": 0.0,
    "Q8_0": 0.04,
    "Q6_K": 0.35,
    "Q5_K_M": 0.91,
    "Q5_K_S": 1.68,
    "Q5_1": 1.70,
    "Q5_0": 2.11,
    "Q4_K_M": 2.82,
    "Q4_K_S": 4.31,
    "Q4_1": 7.24,
    "Q4_0": 7.52,
    "Q3_K_L": 8.92,
    "Q3_K_M": 10.54,
    "Q3_K_S": 26.2,
    "Q2_K": 56.5,  # +3.5199 at Llama-3-8B: llama.cpp's tools/quantize listing (not in the scoreboard)
}
_RTN = " (round-to-nearest with the clip search, tests/kernels/test_quantized_perplexity.py)"
# the torch engine's formats quantized while loading, against the 16-bit weights they were made from
TORCH_PPL_INCREASE_PCT = {
    "W8A16": (0.2, _STARTER + ": 16.83 -> 16.86 on 209 tokens"),
    "FP8": (1.5, _STARTER + ": 14.76 -> 14.98 on 1024 tokens"),
    # as the loader quantizes while loading: round-to-nearest with the per-group clip search, no calibration (the
    # AWQ-style option needs activations the loader does not collect: 18.77 and 18.42).  The starter's weights are
    # already Q4_1, so a second 4-bit grid costs it more than a 16-bit model loses: a pessimistic figure
    "W4A16": (33.8, _STARTER + ": 16.83 -> 22.53 on 209 tokens" + _RTN),
    # attention projections W8A16, MLP W4A16, measured the same way
    "W4A16+attn8": (15.3, _STARTER + ": 16.83 -> 19.40 on 209 tokens" + _RTN),
}

_LLAMA2_INT4 = (
    "Llama-2-7B on WikiText-2 at 4 bits in groups of 128, FP16 5.47 (github.com/dwithchenna/llm-quantization, "
    "GPTQ by AutoGPTQ, AWQ by its own implementation; the AWQ paper, arXiv 2306.00978, gives AWQ 5.60 too)"
)
# GPTQ / AWQ checkpoints (ModelSpec.file_type labels, by "METHOD-Nbit"), against the 16-bit model they were made from
CHECKPOINT_PPL_INCREASE_PCT = {
    "GPTQ-4bit": (7.3, _LLAMA2_INT4 + ": GPTQ 5.87"),
    "AWQ-4bit": (2.4, _LLAMA2_INT4 + ": AWQ 5.60"),
    # no published 8-bit figure at hand: per-channel round-to-nearest int8 (W8A16's) bounds it from above
    "GPTQ-8bit": (0.2, "at most W8A16's: " + _STARTER + ": 16.83 -> 16.86 on 209 tokens"),
}


def checkpoint_quality(label: str) -> QualityLoss | None:
    """The default figure of a GPTQ / AWQ label ("GPTQ-4bit-g128-actorder"), or None for any other format."""
    method_bits = "-".join(label.split("-")[:2])
    if method_bits not in CHECKPOINT_PPL_INCREASE_PCT:
        return None
    pct, source = CHECKPOINT_PPL_INCREASE_PCT[method_bits]
    return QualityLoss(pct, f"default: {source}")


@dataclass(frozen=True)
class QualityLoss:
    pct: float  # perplexity increase over the model's best format, %
    source: str  # "measured: hearth ppl --compare ...", "default: ..."


def format_quality(fmt: str, backend: str, source_quant: str | None, records: dict | None = None) -> QualityLoss:
    """The perplexity increase of running a model as `fmt` on `backend`, against the model's best format: its
    own file for a GGUF (`source_quant`, the file type: its own blocks, in either engine, cost nothing more), the
    16-bit weights otherwise.  `records`: this model's measured figures, format -> (pct, source), from `hearth
    ppl --compare` (app/measurements.py); they win over the defaults, whose sources are named.  A GPTQ / AWQ
    folder's label costs what its method does against the 16-bit original (CHECKPOINT_PPL_INCREASE_PCT)."""
    if records and fmt in records:
        pct, source = records[fmt]
        return QualityLoss(float(pct), f"measured: {source}")
    own = source_quant is not None and (fmt == source_quant or fmt == "GGUF" or fmt in ("bf16", "fp16"))
    if own:  # the file's own weights (a 16-bit copy of a GGUF holds its values exactly)
        return QualityLoss(0.0, f"the file's own {source_quant} weights")
    if fmt in ("bf16", "fp16", "fp32"):
        return QualityLoss(0.0, "the model's own 16-bit weights")
    if fmt in TORCH_PPL_INCREASE_PCT:
        pct, source = TORCH_PPL_INCREASE_PCT[fmt]
        more = f" (on top of the file's {source_quant})" if source_quant else ""
        return QualityLoss(pct, f"default: {source}{more}")
    if (checkpoint := checkpoint_quality(fmt)) is not None:  # a GPTQ / AWQ folder's own packed weights
        return checkpoint
    if fmt in LLAMA_CPP_PPL_INCREASE_PCT:
        return QualityLoss(LLAMA_CPP_PPL_INCREASE_PCT[fmt], f"default: {_LLAMA_CPP_SCOREBOARD}")
    return QualityLoss(100.0, f"unknown: no figure for {fmt}")
