"""The quantization transform: module swap, AWQ-style scaling, GGUF block repacking (bit-exact vs gguf)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from backends.torch_engine.quantize import (QuantConfig, QuantLinear, awq_quantize, collect_calibration,
                                            quantize_model, quantize_weight, repack_gguf)
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


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q8_0"])
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


def test_repack_gguf_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError, match="needs 36 uint8 bytes"):
        repack_gguf(torch.zeros(35, dtype=torch.uint8), "Q4_0", 2, 32)
    with pytest.raises(ValueError, match="cannot repack"):
        repack_gguf(torch.zeros(10, dtype=torch.uint8), "Q6_K", 1, 256)
