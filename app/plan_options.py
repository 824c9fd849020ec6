"""A hardware plan (hwprobe.plan) as the LoadOptions an engine loads with (app/loading.py's decide).

The flags the user gave in Settings (ctx, n_gpu_layers, kv_cache_type, threads) win over the plan here; the
torch engine's own fields (dtype, weight format, KV pool bytes, device, ranks, speculative decoding) come from a
torch plan only, and a llama.cpp load keeps their "auto" defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from app.paths import get_paths
from app.settings import Settings
from backends.api import LoadOptions
from hwprobe.plan_types import Plan
from hwprobe.report import HardwareReport
from hwprobe.support import BF16_MIN_CC

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# plan.quant -> LoadOptions.weight_quant; "GGUF" is the file's own quantized (weight_map.REPACK_KIND) blocks, repacked
# (backends/torch_engine/quantize.MIXED: "W4A16+attn8" is int4 with the attention projections int8)
TORCH_QUANTS = {"W8A16": "int8", "W4A16": "int4", "FP8": "fp8", "GGUF": "gguf", "W4A16+attn8": "int4+attn8"}


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def kernel_check_record() -> Path:
    """Where the torch engine keeps its kernel self-check verdicts per device (`hearth doctor` shows them)."""
    return get_paths().cache_dir / "kernel_checks.json"


def _torch_dtype(plan: Plan, report: HardwareReport) -> str:
    """The compute dtype of a torch plan: its own for bf16/fp16/fp32; for a quantized format on a GPU the half
    precision the planner priced it in (bf16 from compute capability 8.0, else fp16: torch.cuda's "auto" would
    take bf16 on a Turing card, where it is emulated); "auto" on CPU."""
    if plan.quant in _TORCH_DTYPES:
        return _TORCH_DTYPES[plan.quant]
    if not plan.device.startswith("cuda"):  # a CPU plan keeps a GGUF's blocks only with bf16 compute
        return "float32" if plan.kv_cache_type == "f32" else "bfloat16"  # f32: a GPTQ / AWQ folder without AVX-512
    used = {d.index for d in plan.devices if d.kind == "gpu" and d.used}
    ccs = [g.cc for g in report.gpus if g.index in used] if plan.device.startswith("cuda") else []
    if not ccs or any(cc is None for cc in ccs):
        return "auto"
    return "bfloat16" if all(cc >= BF16_MIN_CC for cc in ccs) else "float16"


def plan_options(
    plan: Plan, report: HardwareReport, settings: Settings, *, backend: str, seqs: int, draft_path: str | None
) -> LoadOptions:
    """The LoadOptions of `plan` for `backend` (the user's choice, else the plan's), `seqs` sequences at once and
    the speculative draft at `draft_path` (decide_speculative); the user's flags in `settings` win."""
    torch = backend == "torch"
    n_gpu_layers = -1 if plan.n_gpu_layers >= plan.n_layers else plan.n_gpu_layers
    return LoadOptions(
        n_ctx=settings.ctx or plan.ctx,
        n_gpu_layers=settings.n_gpu_layers if settings.n_gpu_layers is not None else n_gpu_layers,
        split_mode=plan.split_mode,
        tensor_split=plan.tensor_split,
        main_gpu=plan.main_gpu,
        kv_cache_type=settings.kv_cache_type or plan.kv_cache_type,
        flash_attn=plan.flash_attn,
        n_threads=settings.threads or physical_cores(),
        adaptive_threads=settings.threads is None,  # --threads N is exactly N; else the torch engine adapts
        n_batch=plan.batch_size,
        max_num_seqs=seqs,
        # the plan is the allocation: the torch engine's KV pool is the bytes the plan gave it (whole blocks)
        kv_cache_bytes=plan.kv_pool_bytes if torch and plan.backend == "torch" and plan.kv_pool_bytes else None,
        # and the host RAM it pins for swapping preempted requests' KV blocks (0 without a GPU)
        swap_space_bytes=plan.swap_space_bytes if torch and plan.backend == "torch" else 0,
        dtype=_torch_dtype(plan, report) if torch else "auto",
        # every torch plan names its weights: "GGUF" (the file's blocks, GPU or CPU), a quantized format, or
        # dense ("none") in the plan's dtype
        weight_quant=TORCH_QUANTS.get(plan.quant, "none") if torch else "auto",
        device=plan.device if torch else "auto",
        # a MoE plan's overflow experts in host RAM (llama.cpp tensor buffer overrides); a user-fixed
        # --n-gpu-layers is plain layer offload
        cpu_expert_layers=plan.cpu_expert_layers if not torch and settings.n_gpu_layers is None else 0,
        tensor_parallel=plan.tensor_parallel if torch and plan.backend == "torch" else 1,
        speculative=plan.speculative.method if torch else "off",
        draft_model=draft_path if torch else None,
        speculative_k=plan.speculative.k or 8,
        ttft_target_ms=settings.ttft_target_ms,
        # the torch engine checks its Triton kernels on a new device once and remembers the verdicts here
        kernel_check_record=str(kernel_check_record()) if torch else None,
        # the torch engine keeps its prepared CPU weights here, so the next start maps them (issue 24);
        # HEARTH_WEIGHT_CACHE=0 turns that off (the test suite does: ~300 MiB an entry for the starter)
        weight_cache_dir=str(get_paths().cache_dir / "weights")
        if torch and os.environ.get("HEARTH_WEIGHT_CACHE", "1") != "0"
        else None,
    )
