"""ModelShape: the little the planner needs to know about a model.

hwprobe never reads model files (backends does, into a ModelSpec, and calls `ModelSpec.to_shape()`); this keeps
the planner a pure function of numbers that tests can write by hand for Llama-2-70B or Mixtral without the file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    name: str  # what to call the model in reasons ("Llama-2-13B")
    architecture: str  # GGUF general.architecture ("llama", "qwen2", "gemma3", ...)
    n_layers: int  # transformer blocks
    hidden_size: int  # embedding width
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA: fewer than n_heads)
    head_dim: int  # per head; key and value share it
    ffn_size: int  # feed-forward inner width (per expert for MoE)
    vocab_size: int
    context_length: int  # training context, tokens
    n_experts: int = 0  # MoE experts per layer (0 = dense)
    n_experts_used: int = 0  # experts active per token
    shared_ffn_size: int = 0  # MoE: inner width of the always-used shared expert(s) (Qwen2-MoE), 0 = none
    sliding_window: int = 0  # tokens a sliding-window layer attends to (0 = none)
    sliding_window_layers: int = 0  # how many of the layers use the sliding window
    quant: str | None = None  # file type of an existing GGUF ("Q4_K_M"); None = the planner chooses
    weight_bytes: int | None = None  # exact bytes of all tensors when a file exists
    layer_bytes: tuple[int, ...] = ()  # exact bytes of each transformer block when a file exists
    embedding_bytes: int | None = None  # token embedding table bytes when a file exists
    output_bytes: int | None = None  # output head bytes when a file exists (0 when tied to the embedding)
    # MoE: exact bytes of each block's routed experts (GGUF ffn_*_exps, HF experts.N.*) when a file exists; the
    # planner may put these in host RAM and keep the rest of the block on the GPU (hwprobe.experts)
    expert_bytes: tuple[int, ...] = ()
    tied_embeddings: bool = False  # the output head reuses the token embedding
    param_count: int | None = None  # parameters; estimated from the shape when None
    tokenizer: str = ""  # "model/pre" of a GGUF ("gpt2/smollm", "llama/default"), "hf", or "" when unknown
    extra: dict[str, Any] = field(default_factory=dict)  # anything else worth showing (rope scaling, ...)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layer_bytes"] = list(self.layer_bytes)
        data["expert_bytes"] = list(self.expert_bytes)
        return data

    @property
    def estimated_param_count(self) -> int:
        """Parameters from the shape alone (attention + FFN + norms + embeddings), for configs without files."""
        if self.param_count is not None:
            return self.param_count
        q = self.hidden_size * self.n_heads * self.head_dim
        kv = 2 * self.hidden_size * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.hidden_size
        experts = max(self.n_experts, 1)
        ffn = 3 * self.hidden_size * self.ffn_size * experts
        router = self.hidden_size * self.n_experts
        shared = 3 * self.hidden_size * self.shared_ffn_size + (self.hidden_size if self.shared_ffn_size else 0)
        per_layer = q + kv + o + ffn + router + shared + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else embed
        return self.n_layers * per_layer + embed + head + self.hidden_size
