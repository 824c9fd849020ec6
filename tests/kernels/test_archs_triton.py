"""The Triton kernel set runs each dense family (on CPU under TRITON_INTERPRET=1, on the GPU when there is one):
QK-norm through the Triton RMSNorm on head-sized rows, partial rotary through the Triton RoPE, Gemma's
sliding-window layers through the windowed Triton attention and its GeGLU through torch's; logits equal the
plain-torch path's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.arch_factory import write_tiny_arch
from tests.conformance.test_dense_archs import SHAPES, _ids, _runner
from tests.kernels.conftest import skip_triton_on_cpu_without_interpreter


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "phi3"])
def test_triton_kernel_set_matches_the_torch_path(tmp_path: Path, arch: str) -> None:
    pytest.importorskip("triton")
    skip_triton_on_cpu_without_interpreter("cpu")
    path = write_tiny_arch(tmp_path / f"{arch}.gguf", arch, **SHAPES[arch])
    ids = _ids(path)[:12]  # past Gemma's window of 8
    triton_logits = _runner(path, kernels="triton").prompt_logits(ids, chunk=5)
    torch.testing.assert_close(triton_logits, _runner(path).prompt_logits(ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt_lens,steps", [([14], 4), ([3, 20, 9], 3)])
def test_gemma3_decode_steps_through_cuda_graph_buffers_match_eager_steps(
    tmp_path: Path, prompt_lens: list[int], steps: int
) -> None:
    """DecodeGraphs' static buffers (capture=False: the step a CUDA graph captures, run eagerly) with Gemma's
    windowed layers: the window reaches the Triton decode kernel through the graph's metadata too."""
    pytest.importorskip("triton")
    from backends.modelspec import load_spec
    from tests.engine.test_cuda_graphs import _compare, _static

    spec = load_spec(write_tiny_arch(tmp_path / "gemma3.gguf", "gemma3", **SHAPES["gemma3"]))
    _compare(spec, "cpu", prompt_lens, steps, _static)
