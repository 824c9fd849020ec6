"""ModelSpec: everything a model file says, in one typed, documented record.  Every other part of hearth
(planner, backends, model store, `hearth models`, `hearth show`) reads models through it.

`load_spec(path)` accepts a GGUF file (or the first shard of a split GGUF) or a Hugging Face folder holding
config.json + *.safetensors + tokenizer.json (backends.hf_folder).  Reading is header-only and fast (see
gguf_reader), and checked (gguf_checks, model_limits): a file no backend could load is refused here, with one
line naming the key, tensor or limit, before any backend sees it.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from backends.gguf_checks import GGUFFigures, check_gguf
from backends.gguf_constants import constants
from backends.gguf_reader import GGUFHeader, SkippedArray, read_model_header, read_string_items
from backends.hf_folder import spec_from_hf_folder
from backends.spec_types import REMOTE_FORMAT, SCHEMA_VERSION, ModelSpec, TensorSpec

__all__ = ["REMOTE_FORMAT", "SCHEMA_VERSION", "ModelSpec", "TensorSpec", "load_spec", "spec_from_gguf"]


# ---------------------------------------------------------------------------------------------------------
# GGUF


def _file_type_name(metadata: dict[str, Any], type_counts: Counter[str]) -> str:
    ft = metadata.get("general.file_type")
    if isinstance(ft, int):
        try:
            name = constants().LlamaFileType(ft).name
            return name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")
        except ValueError:
            pass
    quantized = Counter({k: v for k, v in type_counts.items() if k not in ("F32",)})
    return quantized.most_common(1)[0][0] if quantized else "F32"


def _first(value: Any, default: Any = None) -> Any:
    if isinstance(value, list):
        return max(value) if value else default
    return default if value is None else value


def _arch_value(md: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    """{arch}.{key} (the largest entry of a per-layer array), or `default`."""
    return _first(md.get(f"{arch}.{key}"), default)


def _rope_scaling(md: dict[str, Any], arch: str, names: set[str]) -> dict[str, Any]:
    if _arch_value(md, arch, "rope.scaling.type") not in (None, "none"):
        return {
            "type": _arch_value(md, arch, "rope.scaling.type"),
            "factor": _arch_value(md, arch, "rope.scaling.factor"),
            "original_context_length": _arch_value(md, arch, "rope.scaling.original_context_length"),
        }
    if "rope_freqs.weight" in names:  # Llama 3.1+: the converter stores precomputed frequency factors
        return {"type": "llama3", "rope_freqs_tensor": "rope_freqs.weight"}
    return {}


def _eos_ids(md: dict[str, Any]) -> tuple[int, ...]:
    """The end-of-sequence token, then end-of-turn and end-of-message when they differ from it."""
    eos = md.get("tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if isinstance(eos, int) else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if isinstance(md.get(key), int) and md[key] not in eos_ids:
            eos_ids.append(int(md[key]))
    return tuple(eos_ids)


def _small_metadata(md: dict[str, Any]) -> dict[str, Any]:
    """The metadata a ModelSpec keeps: what was read whole, less the tokenizer and the chat template."""
    return {
        k: v
        for k, v in md.items()
        if not isinstance(v, SkippedArray) and k != "tokenizer.chat_template" and not k.startswith("tokenizer.ggml.")
    }


def _token_texts(header: GGUFHeader, bos: Any, eos: Any) -> dict[int, str]:
    """The texts of the BOS and EOS tokens (read from the file when the token list was skipped)."""
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        return read_string_items(header.path, tokens, [i for i in (bos, eos) if isinstance(i, int)])
    if isinstance(tokens, list):
        return {i: tokens[i] for i in (bos, eos) if isinstance(i, int) and 0 <= i < len(tokens)}
    return {}


def _ffn_size(md: dict[str, Any], arch: str, fig: GGUFFigures) -> int:
    # MoE: the width of one routed expert (Qwen2/3-MoE also store a dense feed_forward_length)
    if fig.n_experts and _arch_value(md, arch, "expert_feed_forward_length"):
        return int(_arch_value(md, arch, "expert_feed_forward_length", 0) or 0)
    return fig.ffn_size


def spec_from_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    quant_type = constants().GGMLQuantizationType  # id -> type, for the tensors' type names
    header, shards = read_model_header(path)
    fig = check_gguf(header, shards)  # every key, limit, tokenizer and tensor shape, before anything uses them
    md = header.metadata
    arch = fig.architecture
    tensors = tuple(
        TensorSpec(t.name, quant_type(t.ggml_type).name, t.shape, t.n_bytes, t.n_elements)
        for h in shards
        for t in h.tensors
    )
    names = {t.name for t in tensors}
    type_counts = Counter(t.ggml_type for t in tensors)
    bos = md.get("tokenizer.ggml.bos_token_id")
    eos = md.get("tokenizer.ggml.eos_token_id")
    pad = md.get("tokenizer.ggml.padding_token_id")
    scaling, eos_ids, small = _rope_scaling(md, arch, names), _eos_ids(md), _small_metadata(md)
    texts = _token_texts(header, bos, eos)
    chat_template = md.get("tokenizer.chat_template")
    return ModelSpec(
        path=str(header.path),
        format="gguf",
        name=str(md.get("general.name") or _stem(header.path)),
        architecture=arch,
        n_layers=fig.n_layers,
        hidden_size=fig.hidden_size,
        n_heads=fig.n_heads,
        n_kv_heads=fig.n_kv_heads,
        head_dim=fig.head_dim,
        ffn_size=_ffn_size(md, arch, fig),
        shared_ffn_size=int(_arch_value(md, arch, "expert_shared_feed_forward_length", 0) or 0),
        vocab_size=fig.vocab_size,
        context_length=fig.context_length,
        rope_base=float(_arch_value(md, arch, "rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_eps=float(_arch_value(md, arch, "attention.layer_norm_rms_epsilon", 1e-5)),
        n_experts=fig.n_experts,
        n_experts_used=fig.n_experts_used,
        sliding_window=fig.sliding_window,
        file_type=_file_type_name(md, type_counts),
        file_size_bytes=sum(h.file_size for h in shards),
        param_count=sum(t.n_elements for t in tensors),
        tensor_types=dict(type_counts),
        tensors=tensors,
        tied_embeddings="output.weight" not in names,
        chat_template=chat_template if isinstance(chat_template, str) else None,
        bos_token_id=int(bos) if isinstance(bos, int) else None,
        eos_token_ids=eos_ids,
        pad_token_id=int(pad) if isinstance(pad, int) else None,
        add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", arch in ("llama", "gemma", "gemma2", "gemma3"))),
        add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
        tokenizer_model=str(md.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(md.get("tokenizer.ggml.pre", "")),
        bos_token_text=texts.get(bos) if isinstance(bos, int) else None,
        eos_token_text=texts.get(eos) if isinstance(eos, int) else None,
        files=tuple(str(h.path) for h in shards),
        metadata=small,
    )


def _stem(path: Path) -> str:
    return re.sub(r"-\d{5}-of-\d{5}$", "", path.stem)


def load_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """ModelSpec of a GGUF file or a Hugging Face folder; ModelFormatError for anything else."""
    p = Path(path).expanduser()
    if p.is_dir():
        return spec_from_hf_folder(p)
    return spec_from_gguf(p)
