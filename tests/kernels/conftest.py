"""Kernel tests: `gpu`-marked tests (the full shape matrix, FP8) skip when no CUDA device is present."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def device() -> str:
    """Where kernel tests put tensors: the GPU when there is one, else CPU (Triton interpreter)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def skip_triton_on_cpu_without_interpreter(device: str) -> None:
    """Triton kernels on CPU tensors run only under TRITON_INTERPRET=1 (tests/conftest.py sets it); a GPU run
    with the interpreter off (TRITON_INTERPRET=0, to compile for real) skips the CPU-only variants."""
    import os

    import pytest

    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 (this run compiles for the GPU)")
