"""The Triton kernel set runs each dense family (on CPU under TRITON_INTERPRET=1, on the GPU when there is one):
QK-norm through the Triton RMSNorm on head-sized rows, partial rotary through the Triton RoPE, Gemma's GeGLU
and sliding-window layers through their torch fallbacks; logits equal the plain-torch path's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.arch_factory import write_tiny_arch
from tests.conformance.test_dense_archs import SHAPES, _ids, _runner


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_triton_kernel_set_matches_the_torch_path(tmp_path: Path, arch: str) -> None:
    pytest.importorskip("triton")
    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, **SHAPES[arch])
    ids = _ids(path)[:12]  # past Gemma's window of 8
    triton_logits = _runner(path, kernels="triton").prompt_logits(ids, chunk=5)
    torch.testing.assert_close(triton_logits, _runner(path).prompt_logits(ids), atol=1e-4, rtol=1e-4)
