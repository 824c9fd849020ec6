"""The quantization transform: module swap, AWQ-style scaling, GGUF block repacking (bit-exact vs gguf)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from backends.torch_engine.gguf_repack import GGUF_BLOCKS, REQUANTIZED, repack_gguf
from backends.torch_engine.quantize import (
    QuantConfig,
    QuantLinear,
    awq_quantize,
    collect_calibration,
    quantize_model,
    quantize_weight,
)
from kernels.quant_matmul import dequantize

pytestmark = pytest.mark.kernels


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(256, 384)
        self.down = nn.Linear(384, 256, bias=False)
        self.lm_head = nn.Linear(256, 50, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(torch.relu(self.up(x))))


@pytest.mark.parametrize("kind,tol", [("int8", 0.01), ("int4", 0.15), ("fp8", 0.06)])
def test_quantize_model_swaps_linears(kind: str, tol: float) -> None:
    torch.manual_seed(0)
    model = _Tiny()
    x = torch.randn(7, 256)
    ref = model(x)
    quantize_model(model, QuantConfig(kind))
    assert isinstance(model.up, QuantLinear) and isinstance(model.down, QuantLinear)
    assert isinstance(model.lm_head, nn.Linear)  # skipped by default
    out = model(x)
    assert (out - ref).norm() / ref.norm() < tol


def test_quant_config_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown quantization"):
        QuantConfig("int3")


def test_awq_beats_round_to_nearest_on_outlier_channels() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    acts = torch.randn(128, 256)
    acts[:, :4] *= 50.0  # a few salient input channels, as in real LLM activations
    config = QuantConfig("int4", group_size=128)
    ref = acts @ w.t()
    rtn = acts @ dequantize(quantize_weight(w, config)).t()
    qw, input_scale = awq_quantize(w, acts, config)
    assert input_scale is not None
    awq = (acts * input_scale) @ dequantize(qw).t()
    assert (awq - ref).norm() < 0.8 * (rtn - ref).norm()


def test_calibrated_model_runs_through_quantlinear() -> None:
    torch.manual_seed(0)
    model = _Tiny()
    x = torch.randn(9, 256)
    ref = model(x)
    calib = collect_calibration(model, lambda: model(x), max_rows=4)
    assert calib["up"].shape == (4, 256) and calib["down"].shape == (4, 384)
    quantize_model(model, QuantConfig("int4"), calibration=calib)
    assert (model(x) - ref).norm() / ref.norm() < 0.15


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q8_0", "Q5_0"])
def test_repack_gguf_matches_gguf_dequantize(ggml_type: str) -> None:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, T[ggml_type])  # (6, bytes_per_row) uint8
    want = gguf.quants.dequantize(raw, T[ggml_type])
    qw = repack_gguf(torch.from_numpy(raw), ggml_type, 6, 96, scale_dtype=torch.float32)
    np.testing.assert_array_equal(dequantize(qw).numpy(), want)


def test_repack_gguf_q4_k_from_real_file(gemma_path) -> None:
    import gguf
    import gguf.quants

    reader = gguf.GGUFReader(str(gemma_path))
    t = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_K)
    raw = np.asarray(t.data)[:8]  # first 8 rows are enough
    k = int(t.shape[0])
    want = gguf.quants.dequantize(raw, t.tensor_type)
    qw = repack_gguf(torch.from_numpy(raw.copy()), "Q4_K", 8, k, scale_dtype=torch.float32)
    np.testing.assert_allclose(dequantize(qw).numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ggml_type", ["Q5_0", "Q6_K"])
def test_repack_gguf_from_real_file(gemma_path, ggml_type: str) -> None:
    """Gemma 3 270M's Q5_0 (Q/K/V, gate/up) and Q6_K (9 down projections) tensors: Q5_0 exactly the file's
    weights; Q6_K unpacked exactly, then requantized to int8 per 32 within half a level."""
    import gguf
    import gguf.quants

    from backends.torch_engine.gguf_repack import q6_k_weights

    reader = gguf.GGUFReader(str(gemma_path))
    t = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType[ggml_type])
    raw = np.asarray(t.data)[:16].copy()
    k = int(t.shape[0])
    want = gguf.quants.dequantize(raw, t.tensor_type)
    qw = repack_gguf(torch.from_numpy(raw), ggml_type, 16, k, scale_dtype=torch.float32)
    assert (qw.kind, qw.group_size) == ("int8", 32)
    if ggml_type == "Q5_0":
        assert int(qw.qweight.min()) >= -16 and int(qw.qweight.max()) <= 15
        np.testing.assert_array_equal(dequantize(qw).numpy(), want)
        return
    exact = q6_k_weights(torch.from_numpy(raw).reshape(-1, 210)).reshape(16, k).numpy()
    np.testing.assert_array_equal(exact, want)
    _assert_within_half_a_level(qw, want)


def _assert_within_half_a_level(qw, want: np.ndarray) -> None:
    """An int8 requantization of `want`: scales on the bf16 grid, every value within half its group's level."""
    scales = qw.scales.float()
    assert torch.equal(scales, scales.bfloat16().float())
    level = np.repeat(scales.numpy(), 32, axis=1)
    assert (np.abs(dequantize(qw).numpy() - want) <= 0.5 * level * (1 + 1e-6)).all()
    assert int(qw.qweight.abs().max()) <= 127


# where each type keeps its fp16 scale fields (ggml-common.h): set to small finite values in random blocks
_F16_FIELDS = {
    "Q4_K": (0, 2),
    "Q6_K": (208,),
    "Q5_K": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
}


def _random_blocks(
    ggml_type: str, rows: int, k: int, seed: int = 0, scale: tuple[float, float] = (1e-3, 1e-2)
) -> np.ndarray:
    """Random but valid blocks of a type gguf cannot quantize: random bytes, the fp16 scale fields set to
    values drawn from `scale`.  (rows, k // block values * block bytes) uint8."""
    block_bytes, block_values = GGUF_BLOCKS[ggml_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * k // block_values, block_bytes), dtype=np.uint8)
    for at in _F16_FIELDS[ggml_type]:
        blocks[:, at : at + 2] = np.float16(rng.uniform(*scale, len(blocks))).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _random_q6_k(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Q6_K blocks: random ql/qh bytes and int8 scales (all of -128..127), an fp16 d."""
    return _random_blocks("Q6_K", rows, k, seed, scale=(1e-4, 1e-3))


def test_repack_q6_k_on_synthetic_blocks() -> None:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as T

    from backends.torch_engine.gguf_repack import q6_k_weights

    raw = _random_q6_k(5, 512)
    want = gguf.quants.dequantize(raw, T.Q6_K)
    np.testing.assert_array_equal(q6_k_weights(torch.from_numpy(raw).reshape(-1, 210)).reshape(5, 512).numpy(), want)
    _assert_within_half_a_level(repack_gguf(torch.from_numpy(raw), "Q6_K", 5, 512, torch.float32), want)


@pytest.mark.parametrize("ggml_type", REQUANTIZED)
def test_other_quant_types_are_requantized_to_int8_within_half_a_level(ggml_type: str) -> None:
    """Every other type repack_gguf takes (gguf_repack.REQUANTIZED): int8 per 32 from gguf's exact values."""
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as T

    rows, k = 4, 2 * max(GGUF_BLOCKS[ggml_type][1], 64)
    if ggml_type == "Q5_1":  # gguf quantizes this one
        w = np.random.default_rng(7).standard_normal((rows, k)).astype(np.float32)
        raw = gguf.quants.quantize(w, T.Q5_1)
    else:
        raw = _random_blocks(ggml_type, rows, k, seed=7)
    want = gguf.quants.dequantize(raw, T[ggml_type])
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    qw = repack_gguf(torch.from_numpy(raw), ggml_type, rows, k, torch.float32)
    assert (qw.kind, qw.group_size, qw.out_features, qw.in_features) == ("int8", 32, rows, k)
    _assert_within_half_a_level(qw, want)


def test_repack_gguf_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError, match="needs 36 uint8 bytes"):
        repack_gguf(torch.zeros(35, dtype=torch.uint8), "Q4_0", 2, 32)
    with pytest.raises(ValueError, match="needs 420 uint8 bytes"):
        repack_gguf(torch.zeros(210, dtype=torch.uint8), "Q6_K", 2, 256)
    with pytest.raises(ValueError, match="cannot repack"):
        repack_gguf(torch.zeros(10, dtype=torch.uint8), "IQ1_M", 1, 256)


# ---- on-load quantization helpers (backends/torch_engine/loader.py uses them) ---------------------------------


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("chunk", [1, 384, 1000, 10**9])  # below one row, exactly 3 rows, a ragged split, whole
def test_quantize_rows_in_chunks_is_bit_identical(kind: str, chunk: int) -> None:
    from backends.torch_engine.quantize import quantize_rows

    torch.manual_seed(0)
    w = torch.randn(17, 128, dtype=torch.bfloat16)
    whole = quantize_weight(w, QuantConfig(kind))
    parts = quantize_rows(w, QuantConfig(kind), torch.device("cpu"), chunk_elements=chunk)
    for field in ("qweight", "scales", "offsets"):
        a, b = getattr(whole, field), getattr(parts, field)
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), field
    assert (parts.group_size, parts.in_features, parts.out_features) == (whole.group_size, 128, 17)


def test_layer_config_falls_back_to_smaller_groups_then_dense() -> None:
    from backends.torch_engine.quantize import layer_config

    int4 = QuantConfig("int4")
    assert layer_config(int4, 4096).group_size == 128
    assert layer_config(int4, 576).group_size == 64  # SmolLM2's hidden size
    assert layer_config(int4, 96).group_size == 32
    assert layer_config(int4, 48) is None
    assert layer_config(QuantConfig("int8"), 48).kind == "int8"  # per channel: any width


# ---- GGUF blocks through the Triton kernel (group size 32; Q4_K's sub-blocks) ---------------------------------


def _random_q4_k(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Q4_K blocks: fp16 d and dmin, then random 6-bit scale/min bytes and nibbles."""
    return _random_blocks("Q4_K", rows, k, seed)


def _gguf_raw(ggml_type: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as T

    if ggml_type == "Q4_K":
        return _random_q4_k(n, k, seed)
    if ggml_type == "Q6_K":
        return _random_q6_k(n, k, seed)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return gguf.quants.quantize(w, T[ggml_type])


def test_repack_q4_k_matches_gguf_dequantize_on_synthetic_blocks() -> None:
    import gguf.quants
    from gguf.constants import GGMLQuantizationType as T

    raw = _random_q4_k(5, 512)
    qw = repack_gguf(torch.from_numpy(raw), "Q4_K", 5, 512, scale_dtype=torch.float32)
    np.testing.assert_allclose(dequantize(qw).numpy(), gguf.quants.dequantize(raw, T.Q4_K), rtol=1e-6, atol=1e-7)


# K = 96 / 160: groups of 32 straddle the 64-wide K tiles; 288 is 9 groups; Q4_K needs multiples of 256.
@pytest.mark.parametrize(
    "ggml_type,m,n,k",
    [
        ("Q4_0", 1, 40, 96),
        ("Q4_0", 17, 33, 288),
        ("Q4_1", 3, 64, 160),
        ("Q8_0", 1, 72, 96),
        ("Q8_0", 16, 24, 288),
        ("Q4_K", 2, 20, 256),
        ("Q4_K", 5, 36, 512),
        ("Q5_0", 3, 40, 96),
        ("Q6_K", 2, 24, 256),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # the interpreter does no bf16 arithmetic
def test_triton_runs_repacked_gguf_blocks(ggml_type: str, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """What weight_quant="gguf" hands the CUDA path: group size 32, scales (and int4 offsets) in the
    activation dtype.  The Triton kernel must agree with the float32 reference on those weights."""
    from kernels.quant_matmul import quant_matmul_reference
    from kernels.quant_matmul_triton import quant_matmul_triton
    from tests.kernels.conftest import device

    qw = repack_gguf(
        torch.from_numpy(np.ascontiguousarray(_gguf_raw(ggml_type, n, k))), ggml_type, n, k, scale_dtype=dtype
    ).to(device())
    assert qw.group_size == 32 and qw.kind == ("int4" if ggml_type.startswith("Q4") else "int8")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + n)).to(dtype).to(device())
    want = quant_matmul_reference(x, qw).float()
    for blocks in ((16, 32, 64, 1), (16, 64, 128, 2)):  # a K tile of 2 groups, and one of 4 with split K
        got = quant_matmul_triton(x, qw, blocks=blocks).float()
        err = (got - want).abs().max() / want.abs().max().clamp(min=1.0)
        assert err <= {torch.float16: 2e-2, torch.float32: 2e-4}[dtype], (blocks, float(err))


def test_weight_map_names_the_kinds_repack_gguf_gives() -> None:
    """The planner's rule (weight_map.REPACK_KIND) and the repacker agree on which types keep blocks, and as what."""
    from backends.weight_map import REPACK_KIND

    assert set(REPACK_KIND) == set(GGUF_BLOCKS)
    for ggml_type, kind in REPACK_KIND.items():
        if ggml_type in REQUANTIZED:
            assert kind == "int8"  # repack_gguf's answer for them: the test above
            continue
        k = GGUF_BLOCKS[ggml_type][1]
        raw = np.ascontiguousarray(_gguf_raw(ggml_type, 2, k))
        qw = repack_gguf(torch.from_numpy(raw), ggml_type, 2, k)
        assert (qw.kind, qw.group_size) == (kind, 32)


def test_merged_int4_and_int8_shards_keep_their_own_kinds() -> None:
    """A Q4_K_M layer's Q/K/V: Q4_K Q and K beside a Q6_K V.  The merged projection is split, not requantized:
    Q and K stacked as one int4 part (exactly their repacked weights), V its own int8 part; shards of one kind
    stack into one QuantWeight; any other mix of kinds splits the same way."""
    from backends.torch_engine.gguf_repack import merge_kept
    from backends.torch_engine.loader import _merge

    q = repack_gguf(torch.from_numpy(_random_q4_k(8, 512, seed=1)), "Q4_K", 8, 512, torch.float32)
    k = repack_gguf(torch.from_numpy(_random_q4_k(4, 512, seed=2)), "Q4_K", 4, 512, torch.float32)
    v = repack_gguf(torch.from_numpy(_random_q6_k(4, 512, seed=3)), "Q6_K", 4, 512, torch.float32)
    parts = _merge([q, k, v], torch.bfloat16)
    assert isinstance(parts, list) and [(p.kind, p.out_features) for p in parts] == [("int4", 12), ("int8", 4)]
    assert torch.equal(dequantize(parts[0]), torch.cat([dequantize(q), dequantize(k)]))
    assert parts[1] is v
    assert merge_kept([q, k]).kind == "int4" and torch.equal(dequantize(merge_kept([q, k]))[:8], dequantize(q))
    assert [p.kind for p in merge_kept([q, v, k])] == ["int4", "int8", "int4"]  # only neighbours stack
    fp8 = dataclasses.replace(v, kind="fp8")
    assert [p.kind for p in merge_kept([q, fp8])] == ["int4", "fp8"]
    dense = torch.randn(4, 512).to(torch.bfloat16)
    assert _merge([q, dense], torch.bfloat16).dtype == torch.bfloat16  # a dense part: all dense
