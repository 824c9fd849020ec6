"""The torch device a LoadOptions.device names ("auto": CUDA when torch sees one, else CPU).  Its own module so
that the model runner and the tensor-parallel group (which starts before any runner exists) share it."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
