"""Issue 16 item 3: a file llama.cpp refuses is refused by hearth's own checks before either backend loads it,
so `--backend llama.cpp` and `--backend torch` give the same one line and exit 2 (llama.cpp used to exit 3
with an out-of-memory hint; the torch engine gave tracebacks, or loaded overlapping tensors and printed
garbage).  The torch loader also checks every file tensor's shape against the model it builds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.errors import ModelFormatError
from tests.hostile.clirun import assert_one_line_error, hearth
from tests.hostile.ggufraw import RawGGUF, duplicate, overlap, zero_size


def _unaligned(r: RawGGUF) -> RawGGUF:
    r.tensor("blk.1.ffn_up.weight").offset += 8
    return r


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r.drop_tensor("blk.0.ffn_down.weight"), "lacks tensor blk.0.ffn_down.weight"),
        (duplicate, "appears twice"),
        (overlap, "overlaps"),
        (_unaligned, "not a multiple of the file's alignment"),
        (zero_size("output_norm.weight", 0), "with no elements"),
        (lambda r: r.drop("tokenizer.ggml.model"), "has no tokenizer"),
    ],
    ids=["missing", "duplicate", "overlapping", "unaligned", "zero-size", "no-tokenizer"],
)
def test_both_backends_refuse_the_same_way(edit: Callable[[RawGGUF], RawGGUF], match: str, raw, tmp_path: Path) -> None:
    path = edit(raw()).write(tmp_path / "bad.gguf")
    lines = []
    for backend in ("llama.cpp", "torch"):
        r = hearth("run", "-m", str(path), "--backend", backend, "-n", "4", "hi")
        assert_one_line_error(r, match)
        lines.append(r.error_lines()[0])
    assert lines[0] == lines[1]


def test_loader_checks_shapes_before_reading_weights(raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec whose config disagrees with its tensors (here: one KV head where the file has two) is refused by
    the loader itself, before a single weight is read."""
    pytest.importorskip("torch")
    import torch

    from backends.modelspec import load_spec
    from backends.torch_engine import loader
    from kernels.dispatch import kernel_set

    spec = load_spec(raw().write(tmp_path / "ok.gguf"))
    wrong = dataclasses.replace(spec, n_kv_heads=1)

    def no_reading(*args: object, **kwargs: object):
        raise AssertionError("weights were read before the shapes were checked")

    monkeypatch.setattr(loader, "file_weights", no_reading)
    with pytest.raises(
        ModelFormatError, match=r"blk\.0\.attn_k\.weight is \[32, 64\] \(out, in\), but .* needs \[16, 64\]"
    ):
        loader.load_model(wrong, kernel_set("reference"), torch.float32, torch.device("cpu"))
