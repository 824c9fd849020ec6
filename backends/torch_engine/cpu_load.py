"""Load a dense model for the CPU through the prepared-weight cache (weight_cache.py, prepared.py).

On a miss: loader.load_model (read, repack / dequantize, assemble), then quantize.prepare_for_cpu (dense prefill
copies, torch's packed layouts), then the result is stored.  On a hit: the model is built on the meta device and
its tensors are the cached ones, mapped from the file; nothing is read from the GGUF, repacked or dequantized.
Measured on the starter (2-core Zen 4, loaded machine): docs/torch-engine.md "Cold start".

Cached: GGUF models and GPTQ / AWQ folders on the CPU only (a GPTQ / AWQ folder's packed integers are unpacked,
re-laid for torch's CPU kernels and given dense prefill copies at every load, as a GGUF's blocks are; its key also
stamps the folder's JSON files, where the quantization config lives).  Not: GPUs (the prepared weights live in
device memory; a GPU load is bounded by PCIe, not by the preparation), tensor-parallel ranks, models with experts,
16-bit Hugging Face folders (their safetensors already load by mapping, bf16 as stored).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from backends.modelspec import ModelSpec
from backends.quant_config import spec_quant
from backends.torch_engine.cpu_head import head_rows
from backends.torch_engine.loader import config_from_spec, load_model
from backends.torch_engine.models import family
from backends.torch_engine.prepared import prepared_state, restore_prepared
from backends.torch_engine.quantize import QuantLinear, prepare_for_cpu
from backends.torch_engine.weight_cache import WeightCache, entry_key
from kernels.dispatch import KernelSet

log = logging.getLogger(__name__)

HEAD_ROWS = ("lm_head._int8.qweight", "lm_head._int8.scales")  # the entry's names for head_rows' tensors


@dataclass(frozen=True)
class CpuLoad:
    model: nn.Module
    dense_copy_bytes: int  # bytes of the dense prefill copies (quantize.keep_dense_copy)
    packed_layers: int  # layers on torch's packed CPU kernels
    cache: str  # "hit" | "stored" | "not stored" | "off": what the prepared-weight cache did
    # the int8 decode head's rows and scales (cpu_head.head_rows) when asked for and the head takes them
    head_rows: tuple[torch.Tensor, torch.Tensor] | None = None


def cacheable(spec: ModelSpec, device: torch.device, folder: str | None) -> bool:
    prepared = spec.format == "gguf" or spec_quant(spec.path, spec.metadata) is not None  # GGUF, GPTQ / AWQ
    return bool(folder) and device.type == "cpu" and prepared and not spec.n_experts


def key_files(spec: ModelSpec) -> tuple[str, ...]:
    """The files whose stamps key the entry: the weights, and for a folder its JSON files too (config.json or
    quantize_config.json hold a GPTQ / AWQ folder's quantization: a changed one is another model)."""
    files = tuple(spec.files or (spec.path,))
    folder = Path(spec.path)
    return files + tuple(str(f) for f in sorted(folder.glob("*.json"))) if folder.is_dir() else files


def load_for_cpu(
    spec: ModelSpec,
    ops: KernelSet,
    dtype: torch.dtype,
    weight_quant: str,
    n_ctx: int,
    dense_budget_bytes: int,
    cache_folder: str | None,
    after_layer: Callable[[], None] | None = None,
    int8_head: bool = False,
) -> CpuLoad:
    """The prepared CPU model, from the cache in `cache_folder` when it holds it (None: no cache).  `int8_head`:
    also the int8 decode head's rows (cpu_head.py), kept in the entry under HEAD_ROWS: quantizing them took
    0.14-0.45 s of every start and a 113 MiB float32 copy of the starter's embedding."""
    cpu = torch.device("cpu")
    cache = key = None
    if cache_folder and cacheable(spec, cpu, cache_folder):
        cfg = config_from_spec(spec)
        options = {
            "dtype": str(dtype),
            "weight_quant": weight_quant,
            "dense_budget_bytes": dense_budget_bytes,  # whether the dense prefill copies are made
            "long_rope": 0 < cfg.rope_original_ctx < n_ctx,  # LongRoPE's factors pick by context (models/phi3.py)
            "int8_head": int8_head,
        }
        cache, key = WeightCache(cache_folder), entry_key(key_files(spec), options)
        entry = cache.load(key)
        if entry is not None:
            with torch.device("meta"):
                model = family(spec.architecture).MODEL(cfg, ops)
            try:
                restore_prepared(model, entry.tensors, entry.meta)
            except ValueError as exc:
                log.warning("prepared-weight cache entry %s: %s; preparing afresh", entry.path, exc)
                cache._remove(entry.path)
            else:
                layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
                dense = sum(m._dense.numel() * m._dense.element_size() for m in layers if m._dense is not None)
                rows = tuple(entry.tensors.get(k) for k in HEAD_ROWS)
                cached = (rows[0], rows[1]) if rows[0] is not None and rows[1] is not None else None
                packed = sum(m._cpu is not None for m in layers)
                return CpuLoad(model.eval(), dense, packed, "hit", cached if int8_head else None)
    model = load_model(spec, ops, dtype, cpu, weight_quant=weight_quant, n_ctx=n_ctx)
    dense, packed = prepare_for_cpu(model, dtype, dense_budget_bytes, after_layer)
    rows = head_rows(model) if int8_head else None
    stored = "off"
    if cache is not None and key is not None:
        tensors, meta = prepared_state(model)
        if rows is not None:
            tensors.update(zip(HEAD_ROWS, rows))
        stored = "stored" if cache.store(key, tensors, meta) is not None else "not stored"
    return CpuLoad(model, dense, packed, stored, rows)
