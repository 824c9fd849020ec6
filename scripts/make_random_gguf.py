#!/usr/bin/env python3
"""A random-block GGUF shaped like Llama-3-8B in Q4_K_M, written in seconds (numpy, no per-block Python loop).

Why random blocks: decode speed depends on the tensors' shapes and types, never on the values, and the 4.9 GB
file cannot travel to a GPU machine (64 MiB goes with the tree), so scripts/gpu_bench.py --record writes it there
and runs hearth's torch engine and llama.cpp's llama-bench on the same file (issue 42 item 4).

The types follow llama.cpp's Q4_K_M recipe (src/llama-quant.cpp): every projection Q4_K, except attn_v and
ffn_down in the layers `use_more_bits` picks (the first and last eighth, every third in between: 16 of 32),
which are Q6_K; the output head Q6_K, the token embeddings Q4_K, the norms F32.  About 4.9 GB for the 8B shape.

What each block holds: random bytes, then its fp16 scales overwritten with small finite values (Q4_K's d and
dmin in [6.2e-5, 1.2e-4); Q6_K's d too, and its 16 int8 sub-scales cut to 0..15), so weights are |w| < ~0.1
with a spread like a trained model's (~0.02-0.03) and both engines decode without infinities or NaNs through
32 layers.  The vocabulary is a synthetic SentencePiece one ("llama": <unk> <s> </s>, 256 byte tokens,
then "▁t<i>" pieces): every engine loads it without merges, and it has the 128,256 rows of Llama 3's.

    python scripts/make_random_gguf.py OUT.gguf            # the 8B shape (~4.9 GB, seconds on a fast disk)
    python scripts/make_random_gguf.py OUT.gguf --tiny     # 2 layers, hidden 256: for tests
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int = 8192
    rope_base: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LLAMA3_8B = LlamaShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256)
# K-quant rows are multiples of 256 values; the vocabulary holds the 259 special and byte tokens and more
TINY = LlamaShape(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=512, context=512)

# bytes per block and values per block (gguf.constants.GGML_QUANT_SIZES), and where the scales lie in a block
BLOCK = {"Q4_K": (144, 256), "Q6_K": (210, 256)}
FILE_TYPE_Q4_K_M = 15  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
SCALE_RANGE = (6.2e-5, 1.2e-4)  # fp16 normals: no subnormal scales for a kernel to flush


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for which layers' attn_v and ffn_down get Q6_K in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_plan(shape: LlamaShape) -> list[tuple[str, str, tuple[int, int] | tuple[int]]]:
    """(name, type, numpy shape (out_features, in_features) or (n,)) of every tensor, in file order."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    plan: list[tuple[str, str, tuple[int, int] | tuple[int]]] = [("token_embd.weight", "Q4_K", (shape.vocab, h))]
    for i in range(shape.layers):
        more = "Q6_K" if use_more_bits(i, shape.layers) else "Q4_K"
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", "F32", (h,)),
            (p + "attn_q.weight", "Q4_K", (h, h)),
            (p + "attn_k.weight", "Q4_K", (kv, h)),
            (p + "attn_v.weight", more, (kv, h)),
            (p + "attn_output.weight", "Q4_K", (h, h)),
            (p + "ffn_norm.weight", "F32", (h,)),
            (p + "ffn_gate.weight", "Q4_K", (shape.ffn, h)),
            (p + "ffn_up.weight", "Q4_K", (shape.ffn, h)),
            (p + "ffn_down.weight", more, (h, shape.ffn)),
        ]
    plan += [("output_norm.weight", "F32", (h,)), ("output.weight", "Q6_K", (shape.vocab, h))]
    return plan


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int) -> np.ndarray:
    """(rows, bytes per row) uint8: random blocks of `qtype` with small finite scales (the module docstring)."""
    block_bytes, block_values = BLOCK[qtype]
    if cols % block_values:
        raise ValueError(f"{qtype} rows must be a multiple of {block_values} values, got {cols}")
    n_blocks = rows * (cols // block_values)
    blocks = np.frombuffer(bytearray(rng.bytes(n_blocks * block_bytes)), dtype=np.uint8).reshape(n_blocks, -1)
    lo, hi = SCALE_RANGE
    if qtype == "Q4_K":  # d, dmin (fp16) at bytes 0..3, then 12 bytes of 6-bit sub-scales and mins, 128 of nibbles
        scales = rng.uniform(lo, hi, size=(n_blocks, 2)).astype(np.float16)
        blocks[:, 0:4] = scales.view(np.uint8)
    else:  # Q6_K: 128 bytes low bits, 64 high bits, 16 int8 sub-scales (bytes 192..207), d (fp16) at 208..209
        blocks[:, 192:208] &= 0x0F
        blocks[:, 208:210] = rng.uniform(lo, hi, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def synthetic_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece "llama" vocabulary of `size` tokens: <unk>, <s>, </s>, 256 byte tokens, "▁t<i>" pieces."""
    if size < 260:
        raise ValueError(f"the vocabulary needs at least 260 tokens (specials and bytes), got {size}")
    pieces = [f"\u2581t{i}" for i in range(size - 259)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    return tokens, scores, types


def _write_metadata(w, shape: LlamaShape, name: str) -> None:
    w.add_name(name)
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_vocab_size(shape.vocab)
    w.add_file_type(FILE_TYPE_Q4_K_M)
    tokens, scores, types = synthetic_vocab(shape.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)


def write_random_q4_k_m(path: str | Path, shape: LlamaShape = LLAMA3_8B, seed: int = 0) -> Path:
    """Write the random-block Q4_K_M GGUF of `shape` to `path`, one tensor in memory at a time; returns path."""
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    path = Path(path)
    rng = np.random.default_rng(seed)
    plan = tensor_plan(shape)
    w = gguf.GGUFWriter(str(path), "llama")
    _write_metadata(w, shape, f"random-llama-{shape.layers}x{shape.hidden}-Q4_K_M")
    for name, qtype, dims in plan:
        if qtype == "F32":
            w.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows, cols = dims
            nbytes = rows * cols // BLOCK[qtype][1] * BLOCK[qtype][0]
            w.add_tensor_info(name, (rows, nbytes // rows), np.dtype(np.uint8), nbytes, raw_dtype=T[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, qtype, dims in plan:  # the same order as the infos above
        if qtype == "F32":
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32))
        else:
            w.write_tensor_data(random_blocks(rng, qtype, *dims))
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="the GGUF file to write")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 256, vocabulary 512 (for tests)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = write_random_q4_k_m(args.path, TINY if args.tiny else LLAMA3_8B, args.seed)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
