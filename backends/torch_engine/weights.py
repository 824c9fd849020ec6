"""The weights of a model file, one tensor at a time: the iterator both torch loaders (loader.py for dense
models, moe_loader.py for mixtures of experts) read, so neither reaches into the other's privates.

`file_weights(spec)` yields (name, tensor) in the file's own tensor names: GGUF tensors dequantized a few MiB of
rows at a time (or, where `keep` says so, as a QuantWeight of the file's repacked blocks), safetensors in their
own dtype.  GGUF's Llama-family Q/K rows come in llama.cpp's order: `unreorder` puts them back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from backends.errors import ModelFormatError
from backends.gguf_reader import read_model_header
from backends.modelspec import ModelSpec
from backends.quant_config import packed_modules, spec_quant
from backends.torch_engine.gguf_repack import GGUF_BLOCKS, repack_gguf
from backends.torch_engine.gptq_awq import packed_weights
from backends.torch_engine.tp.layers import _cols
from kernels.quant_matmul import QuantWeight

FREQ_FACTORS = "rope_freqs.weight"  # Llama 3's RoPE frequency factors
# per-dimension RoPE factors: a loader takes them aside, they are no parameter
ROPE_FACTOR_TENSORS = frozenset({FREQ_FACTORS, "rope_factors_short.weight", "rope_factors_long.weight"})


def file_weights(
    spec: ModelSpec,
    keep: Callable[[str, str], bool] = lambda name, qtype: False,
    scale_dtype: torch.dtype = torch.float32,
    dtype: torch.dtype = torch.float32,
    select: Callable[[str], Selection] | None = None,
    q6: bool = False,
) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """Every tensor of the model's file(s): gguf_weights for a GGUF (`keep`, `scale_dtype`, `dtype` and `q6` as
    there), hf_weights for a Hugging Face folder (tensors come in their dtype; a GPTQ / AWQ folder's packed
    modules as QuantWeights with scales in `scale_dtype`: gptq_awq.packed_weights); `select`: a
    tensor-parallel rank's rows and columns of each tensor (None: whole tensors)."""
    select = select or no_selection
    if spec.format == "gguf":
        return gguf_weights(spec, keep, scale_dtype, dtype, select, q6)
    quant = spec_quant(spec.path, spec.metadata)
    if quant is not None:  # GPTQ / AWQ: each packed module as a QuantWeight (gptq_awq.py), never 16-bit
        return packed_weights(
            hf_weights(spec, select), quant, packed_modules(quant, spec.tensors, spec.path), scale_dtype
        )
    return hf_weights(spec, select)


def unreorder(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: rows (head, pair i, member a) -> (head, a, i)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


DEQUANT_CHUNK_ELEMENTS = 1 << 22  # weights dequantized at a time (16 MiB of float32)


def dequantize_rows(data: np.ndarray, qtype, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A 2-D GGUF tensor's raw rows -> (out, in) tensor in `dtype`, dequantized a few MiB of rows at a time:
    the float32 form of a large tensor (the starter's 49152 x 576 embedding: 108 MiB, and numpy's copy of it
    as much again) is never whole, so the loader's peak is the tensor in `dtype` plus one chunk."""
    from gguf.quants import dequantize  # lazy: heavy: gguf (numpy)

    out = torch.empty(shape, dtype=dtype)
    step = max(1, DEQUANT_CHUNK_ELEMENTS // max(shape[1], 1))
    for lo in range(0, shape[0], step):
        values = np.asarray(dequantize(data[lo : lo + step], qtype), dtype=np.float32)
        out[lo : lo + step] = torch.from_numpy(values.reshape(-1, shape[1]))
    return out


Selection = tuple[list[tuple[int, int]] | None, tuple[int, int] | None]  # (output-row spans, input-column span)


def no_selection(name: str) -> Selection:
    return None, None


def gguf_weights(
    spec: ModelSpec,
    keep: Callable[[str, str], bool] = lambda name, qtype: False,
    scale_dtype: torch.dtype = torch.float32,
    dtype: torch.dtype = torch.float32,
    select: Callable[[str], Selection] = no_selection,
    q6: bool = False,
) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """Yield (name, tensor in (out, in) order) for every tensor of a GGUF (all shards): 2-D ones in `dtype`,
    1-D ones (norms, biases) in float32; a tensor for which keep(name, type name) is true comes as a
    QuantWeight of its repacked blocks instead (Q6_K ones with `q6` as kind "q6", the GPU's layout, else as
    int8: gguf_repack.py).  select(name): the rows (and columns) to read, a
    tensor-parallel rank's share; they are cut from the file's raw blocks, before any dequantizing (columns on
    whole blocks; a column span inside a block dequantizes the selected rows, then cuts)."""
    # gguf (and safetensors below): imported when a file is read, not when the engine is (gguf alone
    # takes ~0.6 s to import here)
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: heavy: gguf (numpy)
    from gguf.quants import dequantize  # lazy: heavy: gguf (numpy)

    _, shards = read_model_header(spec.path)
    for header in shards:
        raw = np.memmap(header.path, dtype=np.uint8, mode="r")
        for t in header.tensors:
            qtype = GGMLQuantizationType(t.ggml_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
            start = header.data_offset + t.offset
            row_bytes = t.shape[0] // block * type_size
            data = raw[start : start + t.n_bytes].reshape(-1, row_bytes)
            rows, cols = select(t.name)
            if len(t.shape) == 2 and rows is not None:  # a rank's rows: only they leave the mmap
                data = (
                    np.concatenate([data[lo:hi] for lo, hi in rows]) if len(rows) > 1 else data[rows[0][0] : rows[0][1]]
                )
            k = int(t.shape[0])
            if (
                len(t.shape) == 2
                and cols is not None
                and cols[0] % block == 0
                and (cols[1] % block == 0 or cols[1] == k)
            ):
                data = data[:, cols[0] // block * type_size : -(-cols[1] // block) * type_size]  # whole blocks
                k, cols = cols[1] - cols[0], None
            if len(t.shape) == 2 and qtype.name in GGUF_BLOCKS and keep(t.name, qtype.name):
                blocks = torch.from_numpy(np.array(data, dtype=np.uint8))
                qw = repack_gguf(blocks, qtype.name, int(data.shape[0]), k, scale_dtype, q6)
                if cols is not None:  # inside a 256-wide K-quant block: cut the repacked 32-groups instead
                    qw = _cols(qw, cols[0], cols[1], dtype)
                yield t.name, qw
                continue
            shape = (int(data.shape[0]), k) if len(t.shape) == 2 else tuple(int(n) for n in reversed(t.shape))
            try:
                if len(shape) == 2:
                    dense = dequantize_rows(data, qtype, shape, dtype)
                    yield t.name, dense if cols is None else dense[:, cols[0] : cols[1]].contiguous()
                    continue
                values = dequantize(data, qtype)
            except NotImplementedError:
                raise ModelFormatError(
                    f"{spec.path}: tensor {t.name} has type {qtype.name}, which gguf cannot dequantize",
                    "use --backend llama.cpp, or a file in another quant",
                ) from None
            tensor = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
            yield t.name, tensor if rows is None else torch.cat([tensor[lo:hi] for lo, hi in rows])


def hf_weights(
    spec: ModelSpec, select: Callable[[str], Selection] = no_selection
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) of a Hugging Face folder in the file's own dtype: load_model converts each to the
    compute dtype (norms to float32), so a 16-bit checkpoint never passes through a whole float32 copy of a
    tensor (a Llama-2-7B embedding: 500 MB more at the loader's peak).  select(name): a tensor-parallel rank's
    rows / columns, read as slices (safetensors reads only those bytes)."""
    from safetensors import SafetensorError, safe_open  # lazy: heavy: safetensors

    for f in spec.files:
        try:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    rows, cols = select(name)
                    if rows is None and cols is None:
                        yield name, fh.get_tensor(name)
                        continue
                    part = fh.get_slice(name)
                    c = slice(None) if cols is None else slice(*cols)
                    spans = rows or [(0, part.get_shape()[0])]
                    pieces = [part[lo:hi, c] if len(part.get_shape()) == 2 else part[lo:hi] for lo, hi in spans]
                    yield name, torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        except SafetensorError as exc:
            raise ModelFormatError(f"{f} cannot be read as safetensors: {exc}", "download the file again") from None
