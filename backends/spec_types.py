"""ModelSpec and TensorSpec: the typed record of what a model file says (the seam every reader fills and every
other part of hearth reads).  Its own module so that each reader (GGUF in modelspec.py, Hugging Face folders in
hf_folder.py) builds it without importing the other: modelspec.load_spec dispatches to both."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from backends.quant_config import packed_modules, planner_extra, spec_quant
from backends.weight_map import GPU_REPACK_KIND, REPACK_KIND, q6_params, repacked_params, unkept_types
from hwprobe.shape import ModelShape

SCHEMA_VERSION = 4  # bump when the fields or the checks change: the store's metadata cache keys on it


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
            extra["gguf_q6"] = q6_params(self.tensors, self.n_layers, self.architecture)  # of the int8: q6 on a GPU
            extra["gguf_unkept_types"] = unkept_types(self.tensors, self.n_layers, self.architecture)
            if out is not None and out is not embed:  # untied: head and embedding kept as int4 / int8, or None (16-bit)
                extra["gguf_head_kind"] = REPACK_KIND.get(out.ggml_type)
                extra["gguf_embed_kind"] = REPACK_KIND.get(embed.ggml_type) if embed is not None else None
                extra["gguf_head_gpu_kind"] = GPU_REPACK_KIND.get(out.ggml_type)  # Q6_K: q6
                extra["gguf_embed_gpu_kind"] = GPU_REPACK_KIND.get(embed.ggml_type) if embed is not None else None
        elif (quant := spec_quant(self.path, self.metadata)) is not None:  # GPTQ / AWQ: its own packed weights
            modules = packed_modules(quant, self.tensors, self.path)
            extra["checkpoint_quant"] = planner_extra(quant, modules, self.n_layers, _layer_index)
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


def remote_spec(name: str, url: str, context_length: int = 0) -> ModelSpec:
    """A ModelSpec for model `name` served at `url` (context_length 0 = the server did not say)."""
    return ModelSpec(
        path=url,
        format=REMOTE_FORMAT,
        name=name,
        architecture="remote",
        n_layers=0,
        hidden_size=0,
        n_heads=0,
        n_kv_heads=0,
        head_dim=0,
        ffn_size=0,
        vocab_size=0,
        context_length=context_length,
        rope_base=0.0,
        rope_scaling={},
        rms_eps=0.0,
        n_experts=0,
        n_experts_used=0,
        sliding_window=0,
        file_type="remote",
        file_size_bytes=0,
        param_count=0,
        tensor_types={},
        tensors=(),
        tied_embeddings=False,
        chat_template=None,
        bos_token_id=None,
        eos_token_ids=(),
        pad_token_id=None,
        add_bos_token=False,
        add_eos_token=False,
        tokenizer_model="remote",
        tokenizer_pre="",
    )
