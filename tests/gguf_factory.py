"""Build tiny GGUF files for tests with gguf's own writer.

`write_tiny_llama(path, ...)` writes a random-weight Llama-architecture model (a few layers, hidden 64) that
llama.cpp and hearth's torch engine both load.  By default it copies the starter model's tokenizer (tokens,
merges, token types, special ids and chat template), so prompts tokenize exactly as for SmolLM2; pass
`vocab_size` to use a small synthetic byte-level vocabulary instead (faster, no starter model needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

_TOKENIZER_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


# A copy of the starter's tokenizer fields and chat template (export_starter_tokenizer), for machines where the
# 98 MB starter cannot go (a GPU machine gets 64 MiB of files): the tiny models built from it are the same.
TOKENIZER_ENV = "HEARTH_TEST_STARTER_TOKENIZER"
_TEMPLATE_KEY = "tokenizer.chat_template"


def _starter_tokenizer() -> dict[str, Any]:
    """The starter's tokenizer fields and chat template: from the starter, else from the $HEARTH_TEST_STARTER_
    TOKENIZER export; a test that needs them skips when neither is there."""
    import gzip
    import json
    import os

    from app.store import starter_model_path
    from backends.gguf_reader import read_header

    path = starter_model_path()
    if path is not None:
        md = read_header(path, keep_arrays=_TOKENIZER_KEYS).metadata
        return {k: md[k] for k in (*_TOKENIZER_KEYS, _TEMPLATE_KEY) if k in md}
    export = os.environ.get(TOKENIZER_ENV)
    if export and Path(export).is_file():
        with gzip.open(export, "rt") as f:
            return json.load(f)
    import pytest

    pytest.skip(f"the starter model is not installed (nor a tokenizer export in ${TOKENIZER_ENV})")


def export_starter_tokenizer(path: str | Path) -> Path:
    """Write the starter's tokenizer fields and chat template as gzipped JSON (about 1 MB)."""
    import gzip
    import json

    with gzip.open(path, "wt") as f:
        json.dump({k: list(v) if not isinstance(v, str) else v for k, v in _starter_tokenizer().items()}, f)
    return Path(path)


def spm_vocab(size: int = 700) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style "llama" vocabulary like Llama 2's, trained here on tests/data/english.txt:
    <unk>, <s>, </s> (unknown, control), 256 byte tokens <0x00>..<0xFF>, a user-defined <|user|>, then "▁"
    pieces with score -rank.  Deterministic."""
    from tokenizers import SentencePieceBPETokenizer

    text = (Path(__file__).parent / "data" / "english.txt").read_text()
    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(
        [text], vocab_size=size, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    pieces = [
        t for t, _ in sorted(trainer.get_vocab().items(), key=lambda kv: kv[1]) if t not in ("<unk>", "<s>", "</s>")
    ]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|user|>"] + pieces
    types = [2, 3, 3] + [6] * 256 + [4] + [1] * len(pieces)
    scores = [0.0] * 260 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def write_tokenizer(w: Any, tokenizer: str) -> list[str]:
    """Write a tokenizer's fields into a GGUFWriter, BOS 1 and EOS 2; returns its tokens.  "spm": a SentencePiece
    "llama" vocab (spm_vocab), BOS added; anything else: SmolLM2's byte-level BPE (the starter's), no BOS."""
    if tokenizer == "spm":
        tokens, scores, types = spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
    else:
        md = _starter_tokenizer()
        tokens = md["tokenizer.ggml.tokens"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_merges(md["tokenizer.ggml.merges"])
        w.add_token_types(md["tokenizer.ggml.token_type"])
        w.add_add_bos_token(False)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return list(tokens)


def write_tiny_llama(
    path: str | Path,
    *,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context_length: int = 256,
    rope_base: float = 10000.0,
    weight_type: str = "F32",  # "F32" | "F16" | "Q8_0" | "Q4_0" | "Q4_1" (quantized via gguf.quants; also Q5_0 / Q5_1
    # in tensor_types)
    architecture: str = "llama",
    name: str = "tiny-llama",
    chat_template: str | None = "starter",  # "starter" copies SmolLM2's; None writes no template
    tied: bool = True,
    seed: int = 0,
    extra_metadata: dict[str, Any] | None = None,
    qkv_bias: bool = False,  # write attn_q/k/v biases (Qwen2)
    tokenizer: str = "bpe",  # "bpe": SmolLM2's byte-level BPE; "spm": a SentencePiece "llama" vocab (spm_vocab)
    tensor_types: dict[str, str] | None = None,  # name suffix -> type overriding weight_type ("attn_v.weight": "F16")
) -> Path:
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name(name)
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // n_heads)
    ftype = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3}[weight_type]
    w.add_file_type(ftype)

    vocab = len(write_tokenizer(w, tokenizer))
    if tokenizer != "spm":
        w.add_pad_token_id(2)
    if chat_template == "starter":
        chat_template = _starter_tokenizer().get(_TEMPLATE_KEY)
    if chat_template:
        w.add_chat_template(chat_template)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)

    head_dim = hidden // n_heads

    def add(name: str, shape: tuple[int, ...], quantize: bool = True, scale: float = 0.02) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("norm.weight"):
            data = (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)
        wtype = next((t for suffix, t in (tensor_types or {}).items() if name.endswith(suffix)), weight_type)
        if not quantize or wtype == "F32" or len(shape) < 2:
            w.add_tensor(name, data)
        elif wtype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            qtype = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1}[wtype]
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    # numpy shapes are (out_features, in_features); GGUF stores them reversed.
    add("token_embd.weight", (vocab, hidden), quantize=weight_type not in ("Q4_0", "Q4_1"))
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,))
        add(p + "attn_q.weight", (n_heads * head_dim, hidden))
        add(p + "attn_k.weight", (n_kv_heads * head_dim, hidden))
        add(p + "attn_v.weight", (n_kv_heads * head_dim, hidden))
        if qkv_bias:
            for part, rows in (("q", n_heads), ("k", n_kv_heads), ("v", n_kv_heads)):
                add(p + f"attn_{part}.bias", (rows * head_dim,), scale=0.5)
        add(p + "attn_output.weight", (hidden, n_heads * head_dim))
        add(p + "ffn_norm.weight", (hidden,))
        add(p + "ffn_gate.weight", (ffn, hidden))
        add(p + "ffn_up.weight", (ffn, hidden))
        add(p + "ffn_down.weight", (hidden, ffn))
    add("output_norm.weight", (hidden,))
    if not tied:
        add("output.weight", (vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
