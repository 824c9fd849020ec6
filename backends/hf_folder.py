"""ModelSpec of a Hugging Face folder (config.json + *.safetensors + tokenizer.json), checked as a GGUF is:
config values of the wrong type or out of backends.model_limits, a JSON file that is broken or not an object,
a safetensors header whose tensors run outside the file or overlap, all give one line naming the file and key.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from backends.errors import ModelFormatError
from backends.gguf_reader import MAX_TENSORS, open_regular
from backends.model_limits import HINT, check_experts, check_heads, check_limit, check_positive_float
from backends.quant_config import SIDE_FILES, SIDE_KEY, find_quant_config, logical_params, packed_modules
from backends.spec_types import ModelSpec, TensorSpec

_HF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "llama",
    "Gemma3ForCausalLM": "gemma3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "PhiForCausalLM": "phi2",
    "Phi3ForCausalLM": "phi3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
MAX_JSON_BYTES = 64 << 20  # config.json / tokenizer_config.json (a big chat template is tens of KiB)
MAX_SAFETENSORS_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object, read with the same care as a GGUF header."""
    with os.fdopen(open_regular(path, what), "rb") as fh:
        raw = fh.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise ModelFormatError(f"{path} is over {MAX_JSON_BYTES >> 20} MiB, too big for a {what}", HINT)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ModelFormatError(f"{path} is not UTF-8 text, so not a {what}", HINT) from None
    except json.JSONDecodeError as exc:
        raise ModelFormatError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", HINT
        ) from None
    except RecursionError:
        raise ModelFormatError(f"{path} nests JSON too deep to be a {what}", HINT) from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} holds a JSON {type(data).__name__}, not the object a {what} is", HINT)
    return data


def _int(cfg: dict[str, Any], key: str, field: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ModelFormatError(f"{where} lacks {key}", "a transformers config.json names the model's shape")
        return default
    return check_limit(field, value, key, where)


def hf_config_shape(config: Any, name: str, where: str = "config.json") -> dict[str, Any]:
    """The shape fields of a Hugging Face config.json (used for folders and for `hearth plan config.json`);
    ModelFormatError naming the key for a value of the wrong type or outside backends.model_limits."""
    if not isinstance(config, dict):
        raise ModelFormatError(f"{where} holds a JSON {type(config).__name__}, not an object", HINT)
    archs = config.get("architectures") or []
    archs = archs if isinstance(archs, list) else []
    arch = (
        next((_HF_ARCH[a] for a in archs if isinstance(a, str) and a in _HF_ARCH), None)
        or str(config.get("model_type", "unknown"))[:64]
    )
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise ModelFormatError(f"{where}: text_config is a {type(text).__name__}, expected an object", HINT)
    n_heads = _int(text, "num_attention_heads", "n_heads", where)
    hidden = _int(text, "hidden_size", "hidden_size", where)
    n_kv = _int(text, "num_key_value_heads", "n_kv_heads", where, n_heads)
    check_heads(n_heads, n_kv, "num_attention_heads", "num_key_value_heads", where)
    if text.get("head_dim") is None and hidden % n_heads:
        raise ModelFormatError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads}, "
            "and there is no head_dim",
            HINT,
        )
    n_experts = _int(text, "num_local_experts", "n_experts", where, 0) or _int(
        text, "num_experts", "n_experts", where, 0
    )
    n_used = _int(text, "num_experts_per_tok", "n_experts_used", where, 0)
    check_experts(n_experts, n_used, "num_local_experts", "num_experts_per_tok", where)
    rs = text.get("rope_scaling") or {}
    if not isinstance(rs, dict):
        raise ModelFormatError(f"{where}: rope_scaling is a {type(rs).__name__}, expected an object or null", HINT)
    # Gemma 3 and Mistral (v0.1: 4096) use their sliding_window; Qwen2's configs name one but switch it off
    use_window = text.get("use_sliding_window", arch == "gemma3" or "MistralForCausalLM" in archs)
    return dict(
        name=name,
        architecture=arch,
        n_layers=_int(text, "num_hidden_layers", "n_layers", where),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=_int(text, "head_dim", "head_dim", where, hidden // n_heads),
        # MoE: each routed expert's width (Qwen2/3-MoE's moe_intermediate_size; Mixtral's intermediate_size)
        ffn_size=_int(text, "moe_intermediate_size", "ffn_size", where, 0)
        if n_experts and text.get("moe_intermediate_size") is not None
        else _int(text, "intermediate_size", "ffn_size", where, 0),
        shared_ffn_size=_int(text, "shared_expert_intermediate_size", "ffn_size", where, 0),
        vocab_size=_int(
            text, "vocab_size", "vocab_size", where, config.get("vocab_size") if text is not config else None
        ),
        context_length=_int(text, "max_position_embeddings", "context_length", where, 2048),
        rope_base=check_positive_float(text.get("rope_theta", 10000.0), "rope_theta", where),
        rope_scaling=dict(rs),
        rms_eps=check_positive_float(text.get("rms_norm_eps", 1e-5), "rms_norm_eps", where, 1.0),
        n_experts=n_experts,
        n_experts_used=n_used,
        sliding_window=_int(text, "sliding_window", "sliding_window", where, 0) if use_window is True else 0,
        tied_embeddings=config.get("tie_word_embeddings", False) is True,
    )


def _safetensors_tensors(files: list[Path]) -> list[TensorSpec]:
    tensors: dict[str, TensorSpec] = {}
    for f in files:
        with os.fdopen(open_regular(f, "safetensors file"), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            raw = fh.read(8)
            if len(raw) < 8:
                raise ModelFormatError(f"{f} is truncated (no safetensors header)", "download the file again")
            n = int.from_bytes(raw, "little")
            if n > MAX_SAFETENSORS_HEADER_BYTES or 8 + n > size:
                raise ModelFormatError(
                    f"{f} is corrupt: its safetensors header claims {n:,} bytes of the file's {size:,}",
                    "download it again",
                )
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise ModelFormatError(f"{f} has a corrupt safetensors header: {exc}", "download it again") from None
        if not isinstance(header, dict) or len(header) > MAX_TENSORS:
            raise ModelFormatError(
                f"{f} has a corrupt safetensors header: not an object of at most {MAX_TENSORS:,} tensors",
                "download it again",
            )
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            spec = _safetensors_tensor(f, name, info, size - 8 - n)
            if name in tensors:
                raise ModelFormatError(f"{f}: tensor {name} is in two safetensors files", HINT)
            tensors[name] = spec
            spans.append((info["data_offsets"][0], info["data_offsets"][1], name))
        spans.sort()
        for (_, end, before), (start, _, name) in zip(spans, spans[1:]):
            if start < end:
                raise ModelFormatError(f"{f} is corrupt: tensor {name} overlaps {before}", "download it again")
    return list(tensors.values())


def _safetensors_tensor(f: Path, name: str, info: Any, data_bytes: int) -> TensorSpec:
    def bad(what: str) -> ModelFormatError:
        return ModelFormatError(f"{f} is corrupt: safetensors tensor {name[:80]} {what}", "download it again")

    if not isinstance(info, dict):
        raise bad("has no description")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
        raise bad(f"has dtype {str(dtype)[:20]!r}, which hearth does not know")
    if (
        not isinstance(shape, list)
        or len(shape) > 8
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
    ):
        raise bad(f"has shape {str(shape)[:60]}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise bad(f"has data_offsets {str(offsets)[:60]} outside the file's {data_bytes:,} data bytes")
    n_el = 1
    for d in shape:
        n_el *= d
    if offsets[1] - offsets[0] != n_el * _DTYPE_BYTES[dtype]:
        raise bad(
            f"spans {offsets[1] - offsets[0]:,} bytes, but {dtype} x {shape} needs {n_el * _DTYPE_BYTES[dtype]:,}"
        )
    return TensorSpec(name, dtype, tuple(shape), offsets[1] - offsets[0], n_el)


def _token_id(value: Any, key: str, where: str, vocab: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise ModelFormatError(
            f"{where}: {key} is {str(value)[:40]}, expected a token id below the vocabulary's {vocab:,}", HINT
        )
    return value


def spec_from_hf_folder(folder: str | os.PathLike[str]) -> ModelSpec:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise ModelFormatError(
            f"{folder} has no config.json",
            "a Hugging Face model folder needs config.json, *.safetensors and tokenizer.json",
        )
    config = read_json_object(cfg_path, "model config")
    shape = hf_config_shape(config, folder.name, str(cfg_path))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{folder} has no *.safetensors files", "download the weights (hearth pull REPO_ID)")
    tensors = tuple(_safetensors_tensors(files))
    side = {f.name: read_json_object(f, "quantization config") for f in (folder / n for n in SIDE_FILES) if f.exists()}
    quant = find_quant_config(config, side, str(cfg_path))
    if quant is not None:  # GPTQ / AWQ: every packed module checked from the headers (backends/quant_config.py)
        packed_modules(quant, tensors, str(folder))
    template = None
    special: dict[str, Any] = {}
    tok_cfg = folder / "tokenizer_config.json"
    if tok_cfg.exists():
        special = read_json_object(tok_cfg, "tokenizer config")
        template = special.get("chat_template") if isinstance(special.get("chat_template"), str) else None
        for key in ("add_bos_token", "add_eos_token"):
            if key in special and not isinstance(special[key], bool):
                raise ModelFormatError(f"{tok_cfg}: {key} is {str(special[key])[:40]}, expected true or false", HINT)
    vocab = shape["vocab_size"]
    eos = config.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [eos]
    eos_ids = tuple(
        i for i in (_token_id(e, "eos_token_id", str(cfg_path), vocab) for e in eos_list[:16]) if i is not None
    )
    pad = config.get("pad_token_id")
    type_counts = Counter(t.ggml_type for t in tensors)
    dominant = type_counts.most_common(1)[0][0] if type_counts else "F16"
    names = {t.name for t in tensors}
    shape["tied_embeddings"] = shape["tied_embeddings"] or not {"lm_head.weight", "lm_head.qweight"} & names
    return ModelSpec(
        path=str(folder),
        format="safetensors",
        **shape,
        file_type=quant.label if quant is not None else dominant,
        file_size_bytes=sum(f.stat().st_size for f in files),
        param_count=logical_params(quant, tensors) if quant is not None else sum(t.n_elements for t in tensors),
        tensor_types=dict(type_counts),
        tensors=tensors,
        chat_template=template,
        bos_token_id=_token_id(config.get("bos_token_id"), "bos_token_id", str(cfg_path), vocab),
        # pad is only informational, and old configs say -1 for "none": out of range means none
        eos_token_ids=eos_ids,
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
        add_bos_token=special.get("add_bos_token", True),
        add_eos_token=special.get("add_eos_token", False),
        tokenizer_model="hf",
        tokenizer_pre="",
        bos_token_text=_token_text(special.get("bos_token")),
        eos_token_text=_token_text(special.get("eos_token")),
        files=tuple(str(f) for f in files),
        metadata=_metadata(folder, config, side if quant is not None and "quantization_config" not in config else {}),
    )


def _metadata(folder: Path, config: dict[str, Any], side: dict[str, Any]) -> dict[str, Any]:
    """The spec's metadata: config.json, generation_config.json when there is one (the makers' sampling
    defaults: backends/sampling_defaults.py), and the quantization side file's config the folder runs by
    (`side`: {file name: config}, first one; quant_config.spec_quant reads it back)."""
    metadata: dict[str, Any] = {"config": config}
    for cfg in side.values():
        metadata[SIDE_KEY] = cfg
        break
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.exists():
        metadata["generation_config"] = read_json_object(gen_cfg, "generation config")
    return metadata


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
