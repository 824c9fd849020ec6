"""ModelSpec: everything a model file says, in one typed, documented record.  Every other part of hearth
(planner, backends, model store, `hearth models`, `hearth show`) reads models through it.

`load_spec(path)` accepts a GGUF file (or the first shard of a split GGUF) or a Hugging Face folder holding
config.json + *.safetensors + tokenizer.json (backends.hf_folder).  Reading is header-only and fast (see
gguf_reader), and checked (gguf_checks, model_limits): a file no backend could load is refused here, with one
line naming the key, tensor or limit, before any backend sees it.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backends.gguf_checks import check_gguf
from backends.gguf_reader import SkippedArray, read_model_header, read_string_items
from backends.weight_map import repacked_params
from hwprobe.shape import ModelShape

SCHEMA_VERSION = 3  # bump when the fields or the checks change: the store's metadata cache keys on it


REMOTE_FORMAT = "remote"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ggml_type: str  # "Q4_1", "F32", ... (safetensors: "F16", "BF16", "F32")
    shape: tuple[int, ...]  # GGUF order (fastest-varying first); safetensors order for HF folders
    n_bytes: int
    n_elements: int


@dataclass(frozen=True)
class ModelSpec:
    path: str  # the GGUF file (first shard) or the HF folder
    # "gguf" | "safetensors" | "remote" (a model on an OpenAI-compatible server: no file, its shapes unknown (0),
    # its server applies the chat template; backends/remote/spec.py makes one, the planner and store never see it)
    format: str
    name: str  # general.name, else the file stem
    architecture: str  # "llama", "qwen2", "gemma3", ...
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    context_length: int  # training context, tokens
    rope_base: float
    rope_scaling: dict[str, Any]  # {"type": "linear"|"yarn"|"llama3"..., "factor": ..., ...}; {} = none
    rms_eps: float
    n_experts: int
    n_experts_used: int
    sliding_window: int  # 0 = no sliding-window attention
    file_type: str  # "Q4_K_M", "Q4_1", "F16", ... ("mixed" when unknown)
    file_size_bytes: int  # bytes on disk (all shards / all safetensors files)
    param_count: int  # sum of tensor elements
    tensor_types: dict[str, int]  # ggml type -> number of tensors
    tensors: tuple[TensorSpec, ...]
    tied_embeddings: bool  # no separate output head: logits use the token embedding
    chat_template: str | None  # tokenizer.chat_template (Jinja), None when the file has none
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # eos plus end-of-turn tokens (eot, im_end) the model stops on
    pad_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    tokenizer_model: str  # tokenizer.ggml.model ("gpt2", "llama", ...) or "hf"
    tokenizer_pre: str  # tokenizer.ggml.pre ("smollm", "llama-bpe", ...) or ""
    bos_token_text: str | None = None  # the BOS token's text ("<|im_start|>", "<s>"), for chat templates
    eos_token_text: str | None = None
    files: tuple[str, ...] = ()  # every file of the model (shards, safetensors)
    metadata: dict[str, Any] = field(default_factory=dict)  # other small metadata values, as read
    shared_ffn_size: int = 0  # MoE: inner width of the shared expert(s) every token uses (Qwen2-MoE); 0 = none

    # -- derived --------------------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.weight_bytes / self.param_count if self.param_count else 0.0

    def layer_bytes(self) -> tuple[int, ...]:
        """Bytes of each transformer block (tensors named blk.N.* / model.layers.N.*)."""
        per = [0] * self.n_layers
        for t in self.tensors:
            idx = _layer_index(t.name)
            if idx is not None and idx < self.n_layers:
                per[idx] += t.n_bytes
        return tuple(per)

    def expert_bytes(self) -> tuple[int, ...]:
        """Bytes of each block's routed experts (GGUF blk.N.ffn_*_exps, HF model.layers.N.*.experts.M.*); () for
        a dense model."""
        if not self.n_experts:
            return ()
        per = [0] * self.n_layers
        for t in self.tensors:
            idx = _layer_index(t.name)
            if idx is not None and idx < self.n_layers and ("_exps." in t.name or ".experts." in t.name):
                per[idx] += t.n_bytes
        return tuple(per)

    def tensor(self, name: str) -> TensorSpec | None:
        return next((t for t in self.tensors if t.name == name), None)

    def to_shape(self) -> ModelShape:
        """The planner's view of this model."""
        embed = self.tensor("token_embd.weight") or self.tensor("model.embed_tokens.weight")
        out = self.tensor("output.weight") or self.tensor("lm_head.weight")
        extra: dict[str, Any] = {"rope_scaling": self.rope_scaling, "file_format": self.format}
        if self.format == "gguf":  # per layer (int4, int8) weights the torch engine keeps as the file's blocks
            extra["gguf_repacked"] = repacked_params(self.tensors, self.n_layers, self.architecture)
        return ModelShape(
            name=self.name,
            architecture=self.architecture,
            n_layers=self.n_layers,
            hidden_size=self.hidden_size,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            ffn_size=self.ffn_size,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            n_experts=self.n_experts,
            n_experts_used=self.n_experts_used,
            shared_ffn_size=self.shared_ffn_size,
            expert_bytes=self.expert_bytes(),
            sliding_window=self.sliding_window,
            sliding_window_layers=_sliding_window_layers(self),
            quant=self.file_type if self.format == "gguf" else None,
            weight_bytes=self.weight_bytes,
            layer_bytes=self.layer_bytes(),
            embedding_bytes=embed.n_bytes if embed else None,
            output_bytes=(out.n_bytes if out else 0),
            tied_embeddings=self.tied_embeddings,
            param_count=self.param_count,
            tokenizer="hf" if self.format != "gguf" else f"{self.tokenizer_model}/{self.tokenizer_pre}",
            extra=extra,
        )

    def as_dict(self, with_tensors: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_tensors:
            data.pop("tensors")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        data = dict(data)
        data["tensors"] = tuple(TensorSpec(**{**t, "shape": tuple(t["shape"])}) for t in data.get("tensors", ()))
        data["eos_token_ids"] = tuple(data["eos_token_ids"])
        data["files"] = tuple(data.get("files", ()))
        return cls(**data)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for prefix, pos in (("blk", 1), ("layers", 1)):
        if prefix in parts:
            i = parts.index(prefix) + pos
            if i < len(parts) and parts[i].isdigit():
                return int(parts[i])
    return None


def _sliding_window_layers(spec: ModelSpec) -> int:
    if not spec.sliding_window or spec.architecture == "phi3":  # llama.cpp (and the torch engine) turn Phi's off
        return 0
    pattern = spec.metadata.get(f"{spec.architecture}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per-layer booleans
        return sum(1 for v in pattern if v)
    if spec.architecture.startswith("gemma3"):
        return spec.n_layers - spec.n_layers // 6  # five local layers to every global one
    return spec.n_layers


# ---------------------------------------------------------------------------------------------------------
# GGUF


def _file_type_name(metadata: dict[str, Any], type_counts: Counter[str]) -> str:
    from gguf.constants import LlamaFileType

    ft = metadata.get("general.file_type")
    if isinstance(ft, int):
        try:
            name = LlamaFileType(ft).name
            return name.removeprefix("MOSTLY_").replace("ALL_F32", "F32")
        except ValueError:
            pass
    quantized = Counter({k: v for k, v in type_counts.items() if k not in ("F32",)})
    return quantized.most_common(1)[0][0] if quantized else "F32"


def _first(value: Any, default: Any = None) -> Any:
    if isinstance(value, list):
        return max(value) if value else default
    return default if value is None else value


def spec_from_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    from gguf.constants import GGMLQuantizationType

    header, shards = read_model_header(path)
    fig = check_gguf(header, shards)  # every key, limit, tokenizer and tensor shape, before anything uses them
    md = header.metadata
    arch = fig.architecture

    def a(key: str, default: Any = None) -> Any:
        return _first(md.get(f"{arch}.{key}"), default)

    tensors = tuple(
        TensorSpec(t.name, GGMLQuantizationType(t.ggml_type).name, t.shape, t.n_bytes, t.n_elements)
        for h in shards
        for t in h.tensors
    )
    names = {t.name for t in tensors}
    tokens = md.get("tokenizer.ggml.tokens")
    scaling: dict[str, Any] = {}
    if a("rope.scaling.type") not in (None, "none"):
        scaling = {
            "type": a("rope.scaling.type"),
            "factor": a("rope.scaling.factor"),
            "original_context_length": a("rope.scaling.original_context_length"),
        }
    elif "rope_freqs.weight" in names:  # Llama 3.1+: the converter stores precomputed frequency factors
        scaling = {"type": "llama3", "rope_freqs_tensor": "rope_freqs.weight"}
    eos = md.get("tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if isinstance(eos, int) else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if isinstance(md.get(key), int) and md[key] not in eos_ids:
            eos_ids.append(int(md[key]))
    type_counts = Counter(t.ggml_type for t in tensors)
    small = {
        k: v
        for k, v in md.items()
        if not isinstance(v, SkippedArray) and k != "tokenizer.chat_template" and not k.startswith("tokenizer.ggml.")
    }
    bos = md.get("tokenizer.ggml.bos_token_id")
    pad = md.get("tokenizer.ggml.padding_token_id")
    files = tuple(str(h.path) for h in shards)
    texts: dict[int, str] = {}
    if isinstance(tokens, SkippedArray):
        texts = read_string_items(header.path, tokens, [i for i in (bos, eos) if isinstance(i, int)])
    elif isinstance(tokens, list):
        texts = {i: tokens[i] for i in (bos, eos) if isinstance(i, int) and 0 <= i < len(tokens)}
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
        # MoE: the width of one routed expert (Qwen2/3-MoE also store a dense feed_forward_length)
        ffn_size=int(a("expert_feed_forward_length", 0) or 0)
        if fig.n_experts and a("expert_feed_forward_length")
        else fig.ffn_size,
        shared_ffn_size=int(a("expert_shared_feed_forward_length", 0) or 0),
        vocab_size=fig.vocab_size,
        context_length=fig.context_length,
        rope_base=float(a("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        n_experts=fig.n_experts,
        n_experts_used=fig.n_experts_used,
        sliding_window=fig.sliding_window,
        file_type=_file_type_name(md, type_counts),
        file_size_bytes=sum(h.file_size for h in shards),
        param_count=sum(t.n_elements for t in tensors),
        tensor_types=dict(type_counts),
        tensors=tensors,
        tied_embeddings="output.weight" not in names,
        chat_template=md.get("tokenizer.chat_template") if isinstance(md.get("tokenizer.chat_template"), str) else None,
        bos_token_id=int(bos) if isinstance(bos, int) else None,
        eos_token_ids=tuple(eos_ids),
        pad_token_id=int(pad) if isinstance(pad, int) else None,
        add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", arch in ("llama", "gemma", "gemma2", "gemma3"))),
        add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
        tokenizer_model=str(md.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(md.get("tokenizer.ggml.pre", "")),
        bos_token_text=texts.get(bos) if isinstance(bos, int) else None,
        eos_token_text=texts.get(eos) if isinstance(eos, int) else None,
        files=files,
        metadata=small,
    )


def _stem(path: Path) -> str:
    import re

    return re.sub(r"-\d{5}-of-\d{5}$", "", path.stem)


def load_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """ModelSpec of a GGUF file or a Hugging Face folder; ModelFormatError for anything else."""
    p = Path(path).expanduser()
    if p.is_dir():
        from backends.hf_folder import spec_from_hf_folder  # it builds ModelSpecs: imported here, not at the top

        return spec_from_hf_folder(p)
    return spec_from_gguf(p)
