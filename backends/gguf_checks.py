"""Everything hearth checks in a GGUF before any backend sees it, so that llama.cpp and the torch engine get the
same one-line error (exit 2) instead of llama.cpp's "failed to load" (exit 3, with an out-of-memory hint) and the
torch engine's traceback or, for a file whose tensors overlap, garbage output.

- Metadata types: every key hearth or llama.cpp reads must have the GGUF type llama.cpp reads it with (llama.cpp
  refuses a uint64 block_count as much as a string one), else the error names the key and the type expected.
- Shape figures within backends.model_limits, and consistent: heads a multiple of the KV heads, per-layer arrays
  with one entry per layer, experts used <= experts.
- A tokenizer: tokenizer.ggml.model one llama.cpp knows, a token list (its length is the vocabulary), merges for
  BPE, token types and scores one per token, special token ids inside the vocabulary.
- Tensors: token_embd (and output) shaped (hidden, vocab); every blk.N tensor with N < block_count and every
  layer with tensors; for the Llama-family architectures (ARCH_TENSORS) each layer's attention and MLP tensors
  present with the shapes the metadata implies.
The tensor table's layout (offsets, alignment, overlaps, duplicates, sizes) is checked by gguf_reader itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.errors import ModelFormatError
from backends.gguf_reader import GGUFHeader, GGUFTensorInfo, SkippedArray, type_error
from backends.model_limits import HINT, check_experts, check_heads, check_limit, check_positive_float

_PER_LAYER_TYPES = ("array[uint32]", "array[int32]")

# "{arch}.KEY" -> (the GGUF type llama.cpp reads it with, whether a per-layer array is allowed instead)
ARCH_KEYS: dict[str, tuple[str, bool]] = {
    "block_count": ("uint32", False),
    "context_length": ("uint32", False),
    "embedding_length": ("uint32", False),
    "feed_forward_length": ("uint32", True),
    "attention.head_count": ("uint32", True),
    "attention.head_count_kv": ("uint32", True),
    "attention.key_length": ("uint32", False),
    "attention.value_length": ("uint32", False),
    "vocab_size": ("uint32", False),
    "expert_count": ("uint32", False),
    "expert_used_count": ("uint32", False),
    "expert_feed_forward_length": ("uint32", False),
    "expert_shared_feed_forward_length": ("uint32", False),
    "attention.sliding_window": ("uint32", False),
    "rope.dimension_count": ("uint32", False),
    "rope.freq_base": ("float32", False),
    "rope.scaling.type": ("string", False),
    "rope.scaling.factor": ("float32", False),
    "rope.scaling.original_context_length": ("uint32", False),
    "attention.layer_norm_rms_epsilon": ("float32", False),
    "attention.layer_norm_epsilon": ("float32", False),
}
SPECIAL_TOKENS = ("bos", "eos", "eot", "eom", "unknown", "padding")  # tokenizer.ggml.NAME_token_id
GENERAL_KEYS: dict[str, str] = {
    "general.architecture": "string",
    "general.name": "string",
    "general.file_type": "uint32",
    "tokenizer.ggml.model": "string",
    "tokenizer.ggml.pre": "string",
    "tokenizer.chat_template": "string",
    "tokenizer.ggml.tokens": "array[string]",
    "tokenizer.ggml.merges": "array[string]",
    "tokenizer.ggml.token_type": "array[int32]",
    "tokenizer.ggml.scores": "array[float32]",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool",
    **{f"tokenizer.ggml.{name}_token_id": "uint32" for name in SPECIAL_TOKENS},
}

TOKENIZER_MODELS = ("llama", "gpt2", "bert", "t5", "rwkv", "plamo2")  # llama.cpp's vocabulary types
NO_TOKENIZER = ("none", "no_vocab")

# Per-layer tensors the Llama-family architectures cannot run without, with their GGUF-order shapes
# (shape[0] = in_features) in terms of the layer's figures: h hidden, q = heads x key_length,
# k = kv_heads x key_length, v = kv_heads x value_length, o = heads x value_length, f feed-forward.
_LAYER_SHAPES = {
    "attn_norm.weight": ("h",),
    "attn_q.weight": ("h", "q"),
    "attn_k.weight": ("h", "k"),
    "attn_v.weight": ("h", "v"),
    "attn_output.weight": ("o", "h"),
}
_MLP_SHAPES = {"ffn_gate.weight": ("h", "f"), "ffn_up.weight": ("h", "f"), "ffn_down.weight": ("f", "h")}
ARCH_TENSORS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")


@dataclass(frozen=True)
class GGUFFigures:
    """The shape a GGUF's metadata states, checked (per-layer arrays reduced to their largest entry)."""

    architecture: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # attention.key_length, else hidden / heads
    value_dim: int  # attention.value_length, else head_dim
    ffn_size: int
    vocab_size: int  # the tokenizer's token count, which llama.cpp sizes token_embd by
    context_length: int
    n_experts: int
    n_experts_used: int
    sliding_window: int
    heads_per_layer: tuple[int, ...]
    kv_heads_per_layer: tuple[int, ...]
    ffn_per_layer: tuple[int, ...]


def check_gguf(first: GGUFHeader, shards: list[GGUFHeader]) -> GGUFFigures:
    """Check a GGUF (all shards) as the module docstring says; ModelFormatError with one line naming the key,
    tensor or limit.  Returns the checked figures ModelSpec is built from."""
    where = str(first.path)
    arch = _architecture(first)
    _check_types(first, arch)
    figures = _figures(first, arch, _check_tokenizer(first))
    _check_tensors(where, shards, figures)
    return figures


def _architecture(h: GGUFHeader) -> str:
    arch = h.metadata.get("general.architecture")
    if arch is None:
        raise ModelFormatError(
            f"{h.path} has no general.architecture in its metadata",
            "the file is not a model GGUF (or is damaged): download the model again",
        )
    if h.type_of("general.architecture") != "string":
        raise type_error(h.path, "general.architecture", h.type_of("general.architecture"), "string")
    if not arch or len(arch) > 64 or not arch.replace("_", "").replace("-", "").isalnum():
        raise ModelFormatError(f"{h.path}: general.architecture is {arch[:64]!r}, not an architecture name", HINT)
    return arch


def _check_types(h: GGUFHeader, arch: str) -> None:
    prefix = arch + "."
    for key, got in (h.types or {}).items():
        if key in GENERAL_KEYS:
            expected, per_layer = GENERAL_KEYS[key], False
        elif key.startswith(prefix) and key[len(prefix) :] in ARCH_KEYS:
            expected, per_layer = ARCH_KEYS[key[len(prefix) :]]
        else:
            continue
        if got != expected and not (per_layer and got in _PER_LAYER_TYPES):
            raise type_error(
                h.path, key, got, expected + (" or an array of uint32, one per layer" if per_layer else "")
            )


def _check_tokenizer(h: GGUFHeader) -> int:
    """The vocabulary size (the token list's length) of a GGUF whose tokenizer llama.cpp can load."""
    md = h.metadata
    model = md.get("tokenizer.ggml.model")
    if model is None or model in NO_TOKENIZER:
        raise ModelFormatError(
            f"{h.path} has no tokenizer (tokenizer.ggml.model is {model or 'missing'})",
            "hearth and llama.cpp need the vocabulary inside the GGUF: convert the model again with its tokenizer",
        )
    if model not in TOKENIZER_MODELS:
        raise ModelFormatError(
            f"{h.path}: tokenizer.ggml.model is {model[:40]!r}, which llama.cpp does not know "
            f"(it knows {', '.join(TOKENIZER_MODELS)})",
            HINT,
        )
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelFormatError(f"{h.path} has no tokenizer.ggml.tokens: its tokenizer has no vocabulary", HINT)
    n = check_limit("vocab_size", len(tokens), "the tokenizer.ggml.tokens count", str(h.path))
    if model == "gpt2" and "tokenizer.ggml.merges" not in md:
        raise ModelFormatError(f"{h.path} has a BPE (gpt2) tokenizer without tokenizer.ggml.merges", HINT)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in md and len(md[key]) != n:
            raise ModelFormatError(f"{h.path}: {key} has {len(md[key]):,} entries for {n:,} tokens", HINT)
    for name in SPECIAL_TOKENS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in md and not 0 <= md[key] < n:
            raise ModelFormatError(f"{h.path}: {key} is {md[key]:,} but the vocabulary has {n:,} tokens", HINT)
    return n


def _per_layer(
    h: GGUFHeader, key: str, field: str, n_layers: int, default: int | None, allow_zero: bool
) -> tuple[int, ...]:
    """A uint32 or a per-layer array of them, as one value per layer, each within LIMITS[field]."""
    where = str(h.path)
    value = h.metadata.get(key, default)
    if value is None:
        raise ModelFormatError(f"{where} lacks {key}", "the file is incomplete or not a transformer model GGUF")
    if isinstance(value, (list, SkippedArray)):
        if len(value) != n_layers:
            raise ModelFormatError(
                f"{where}: {key} has {len(value):,} entries for {n_layers} layers (one per layer)", HINT
            )
        values = tuple(value)
    else:
        values = (value,) * n_layers
    for v in values:
        if not (allow_zero and v == 0):
            check_limit(field, v, key, where)
    if max(values) == 0:
        check_limit(field, 0, key, where)  # all zero: refused with the range
    return values


def _scalar(h: GGUFHeader, arch: str, suffix: str, field: str, default: int | None) -> int:
    """{arch}.{suffix}, within LIMITS[field]; `default` when the key is absent (None: it is required)."""
    key, where = f"{arch}.{suffix}", str(h.path)
    if key not in h.metadata:
        if default is None:
            raise ModelFormatError(f"{where} lacks {key}", "the file is incomplete or not a transformer model GGUF")
        return default
    return check_limit(field, h.metadata[key], key, where)


def _heads(h: GGUFHeader, arch: str, n_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(heads, KV heads) per layer, each layer's heads a multiple of its KV heads."""
    heads_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    # hybrid architectures (Jamba, Granite 4) give their recurrent layers 0 heads / 0 KV heads
    lenient = arch not in ARCH_TENSORS
    heads = _per_layer(h, heads_key, "n_heads", n_layers, None, lenient)
    kv = _per_layer(h, kv_key, "n_kv_heads", n_layers, None, lenient) if kv_key in h.metadata else heads
    for i, (q, k) in enumerate(zip(heads, kv)):
        if q and k:
            check_heads(
                q,
                k,
                heads_key,
                kv_key,
                str(h.path) + (f" (layer {i})" if len(set(heads)) > 1 or len(set(kv)) > 1 else ""),
            )
    return heads, kv


def _head_dims(h: GGUFHeader, arch: str, hidden: int, n_heads: int) -> tuple[int, int]:
    """(key length, value length) of a head: attention.key_length, else hidden / heads; value_length, else the
    key length."""
    if f"{arch}.attention.key_length" not in h.metadata and hidden % n_heads:
        raise ModelFormatError(
            f"{h.path}: {arch}.embedding_length {hidden} is not a multiple of "
            f"{arch}.attention.head_count {n_heads}, and there is no "
            f"{arch}.attention.key_length",
            HINT,
        )
    head_dim = _scalar(h, arch, "attention.key_length", "head_dim", hidden // n_heads)
    return head_dim, _scalar(h, arch, "attention.value_length", "head_dim", head_dim)


def _check_vocab_size(h: GGUFHeader, arch: str, n_tokens: int) -> None:
    """{arch}.vocab_size, when given, equal to the tokenizer's token count."""
    key = f"{arch}.vocab_size"
    if key in h.metadata and h.metadata[key] != n_tokens:
        raise ModelFormatError(
            f"{h.path}: {key} is {h.metadata[key]:,} but the tokenizer has {n_tokens:,} tokens", HINT
        )


def _check_floats(h: GGUFHeader, arch: str) -> None:
    """RoPE base and scaling factor positive; norm epsilons in (0, 1)."""
    for suffix, below in (
        ("rope.freq_base", float("inf")),
        ("rope.scaling.factor", float("inf")),
        ("attention.layer_norm_rms_epsilon", 1.0),
        ("attention.layer_norm_epsilon", 1.0),
    ):
        if f"{arch}.{suffix}" in h.metadata:
            check_positive_float(h.metadata[f"{arch}.{suffix}"], f"{arch}.{suffix}", str(h.path), below)


def _figures(h: GGUFHeader, arch: str, n_tokens: int) -> GGUFFigures:
    n_layers = _scalar(h, arch, "block_count", "n_layers", None)
    hidden = _scalar(h, arch, "embedding_length", "hidden_size", None)
    heads, kv = _heads(h, arch, n_layers)
    n_heads, n_kv = max(heads), max(kv)
    head_dim, value_dim = _head_dims(h, arch, hidden, n_heads)
    ffn = _per_layer(h, f"{arch}.feed_forward_length", "ffn_size", n_layers, 0, True)
    _check_vocab_size(h, arch, n_tokens)
    n_experts = _scalar(h, arch, "expert_count", "n_experts", 0)
    n_used = _scalar(h, arch, "expert_used_count", "n_experts_used", 0)
    check_experts(n_experts, n_used, f"{arch}.expert_count", f"{arch}.expert_used_count", str(h.path))
    _check_floats(h, arch)
    return GGUFFigures(
        architecture=arch,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        value_dim=value_dim,
        ffn_size=max(ffn) or _scalar(h, arch, "expert_feed_forward_length", "ffn_size", 0),
        vocab_size=n_tokens,
        context_length=_scalar(h, arch, "context_length", "context_length", 2048),
        n_experts=n_experts,
        n_experts_used=n_used,
        sliding_window=_scalar(h, arch, "attention.sliding_window", "sliding_window", 0),
        heads_per_layer=heads,
        kv_heads_per_layer=kv,
        ffn_per_layer=ffn,
    )


def _tensor_table(where: str, shards: list[GGUFHeader]) -> dict[str, GGUFTensorInfo]:
    """Every shard's tensors by name, none in two shards."""
    tensors: dict[str, GGUFTensorInfo] = {}
    for h in shards:
        for t in h.tensors:
            if t.name in tensors:
                raise ModelFormatError(
                    f"{where}: tensor {t.name} is in two shards ({tensors[t.name].file_index + 1} "
                    f"and {t.file_index + 1})",
                    HINT,
                )
            tensors[t.name] = t
    return tensors


def _expect(
    where: str,
    tensors: dict[str, GGUFTensorInfo],
    fig: GGUFFigures,
    name: str,
    shape: tuple[int, ...],
    required: bool = True,
) -> None:
    """Tensor `name` of shape `shape`, when present; absent, refused when `required`."""
    t = tensors.get(name)
    if t is None:
        if required:
            raise ModelFormatError(
                f"{where} lacks tensor {name}, which a {fig.architecture} model needs",
                "the file is incomplete or not a supported model: download it again",
            )
        return
    if t.shape != shape:
        raise ModelFormatError(
            f"{where}: tensor {name} has shape {list(t.shape)}, but the metadata "
            f"({fig.architecture}) implies {list(shape)}",
            HINT,
        )


def _check_layer_numbers(where: str, tensors: dict[str, GGUFTensorInfo], fig: GGUFFigures) -> None:
    """Every blk.N tensor with N < block_count, and every layer with tensors."""
    layers: set[int] = set()
    for name in tensors:
        if name.startswith("blk."):
            part = name.split(".")[1]
            if not part.isdigit():
                raise ModelFormatError(f"{where}: tensor {name} names no layer number", HINT)
            if int(part) >= fig.n_layers:
                raise ModelFormatError(
                    f"{where}: tensor {name} belongs to layer {int(part)}, but "
                    f"{fig.architecture}.block_count is {fig.n_layers}",
                    HINT,
                )
            layers.add(int(part))
    missing = sorted(set(range(fig.n_layers)) - layers)
    if missing:
        raise ModelFormatError(
            f"{where} has no tensors for layer {missing[0]} "
            f"({len(missing)} of {fig.n_layers} layers are missing; "
            f"{fig.architecture}.block_count is {fig.n_layers})",
            HINT,
        )


def _layer_shapes(fig: GGUFFigures, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i's tensors a Llama-family model needs (ARCH_TENSORS), by name suffix, with their shapes."""
    dims = {
        "h": fig.hidden_size,
        "q": fig.heads_per_layer[i] * fig.head_dim,
        "k": fig.kv_heads_per_layer[i] * fig.head_dim,
        "v": fig.kv_heads_per_layer[i] * fig.value_dim,
        "o": fig.heads_per_layer[i] * fig.value_dim,
        "f": fig.ffn_per_layer[i],
    }
    shapes: dict[str, Any] = dict(_LAYER_SHAPES)
    if not fig.n_experts:
        shapes.update(_MLP_SHAPES)
    return {suffix: tuple(dims[d] for d in dim_names) for suffix, dim_names in shapes.items()}


def _check_tensors(where: str, shards: list[GGUFHeader], fig: GGUFFigures) -> None:
    tensors = _tensor_table(where, shards)
    _expect(where, tensors, fig, "token_embd.weight", (fig.hidden_size, fig.vocab_size))
    _expect(where, tensors, fig, "output.weight", (fig.hidden_size, fig.vocab_size), required=False)
    _check_layer_numbers(where, tensors, fig)
    if fig.architecture not in ARCH_TENSORS:
        return
    _expect(where, tensors, fig, "output_norm.weight", (fig.hidden_size,))
    for i in range(fig.n_layers):
        for suffix, shape in _layer_shapes(fig, i).items():
            _expect(where, tensors, fig, f"blk.{i}.{suffix}", shape)
