"""Issue 46 item 4: a GPTQ / AWQ folder with a malformed quantization config, an unsupported variant or packed
tensors whose shapes disagree is one line and exit 2 on `hearth show`, from the headers alone (cheap), like a
damaged GGUF; what only the values can show (a g_idx that is no grouping, an asymmetric 8-bit zero point) is one
ModelFormatError at load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.gptq_awq_factory import CONFIG, Variant, _write, dense_weights, quantize_checkpoint, write_quantized
from tests.hostile.clirun import assert_one_line_error, hearth

pytest.importorskip("safetensors")
Q = "model.layers.0.self_attn.q_proj"


def _config(tmp: Path, v: Variant, **changes: object) -> Path:
    folder, _ = write_quantized(tmp / "m", v)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"].update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _tensors(tmp: Path, v: Variant, edit: Callable[[dict[str, torch.Tensor]], None], **cfg_changes: object) -> Path:
    tensors, _ = quantize_checkpoint(dense_weights(), v)
    tensors = {k: t.half() if t.is_floating_point() else t for k, t in tensors.items()}
    edit(tensors)
    return _write(tmp / "m", tensors, {**CONFIG, "quantization_config": {**v.config(), **cfg_changes}})


def _side(tmp: Path, text: str) -> Path:
    folder, _ = write_quantized(tmp / "m", Variant(), side_file=True)
    (folder / "quantize_config.json").write_text(text)
    return folder


def _exl2(t: dict[str, torch.Tensor]) -> None:
    t[Q + ".q_weight"] = t.pop(Q + ".qweight")


CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("bits-string", lambda t: _config(t, Variant(), bits="4"), "bits is '4', expected an integer"),
    ("bits-3", lambda t: _config(t, Variant(), bits=3), "GPTQ 3-bit checkpoints are not supported"),
    ("group-0", lambda t: _config(t, Variant(), group_size=0), "group_size is 0"),
    ("group-not-dividing", lambda t: _config(t, Variant(), group_size=48), "not a whole number of groups of 48"),
    ("desc-act-string", lambda t: _config(t, Variant(), desc_act="true"), "desc_act is 'true'"),
    ("marlin", lambda t: _config(t, Variant(), checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
    ("awq-gemv", lambda t: _config(t, Variant(method="awq"), version="GEMV"), "AWQ version 'gemv'"),
    ("exl2", lambda t: _tensors(t, Variant(), _exl2), "EXL2 (ExLlamaV2) checkpoints are not supported"),
    ("no-qzeros", lambda t: _tensors(t, Variant(), lambda d: d.pop(Q + ".qzeros")), "has a qweight but no qzeros"),
    (
        "scales-short",
        lambda t: _tensors(t, Variant(), lambda d: d.update({Q + ".scales": d[Q + ".scales"][:1]})),
        f"{Q}.scales is [1, 64]",
    ),
    (
        "qweight-f16",
        lambda t: _tensors(t, Variant(), lambda d: d.update({Q + ".qweight": d[Q + ".qweight"].half()})),
        "expected 2-D I32",
    ),
    (
        "awq-qzeros-wide",
        lambda t: _tensors(
            t, Variant(method="awq"), lambda d: d.update({Q + ".qzeros": torch.zeros(2, 16, dtype=torch.int32)})
        ),
        f"{Q}.qzeros is [2, 16], but AWQ-4bit-g32 of 64x64 weights needs [2, 8]",
    ),
    (
        "actorder-without-g-idx",
        lambda t: _tensors(t, Variant(act_order=True), lambda d: d.pop(Q + ".g_idx")),
        "has no g_idx",
    ),
    ("side-file-a-list", lambda t: _side(t, "[1, 2]"), "holds a JSON list"),
    ("side-file-method", lambda t: _side(t, '{"quant_method": "hqq"}'), "quant_method 'hqq'"),
]


@pytest.mark.parametrize("case, make, match", CASES, ids=[c[0] for c in CASES])
def test_hostile_quantized_folder(case: str, make: Callable[[Path], Path], match: str, tmp_path: Path) -> None:
    assert_one_line_error(hearth("show", str(make(tmp_path))), match)


def _load(folder: Path) -> None:
    from backends.api import LoadOptions
    from backends.modelspec import load_spec
    from backends.torch_engine.model_runner import ModelRunner

    ModelRunner(load_spec(folder), LoadOptions(n_ctx=32, max_num_seqs=1, dtype="float32", n_threads=2))


def _scrambled_g_idx(t: dict[str, torch.Tensor]) -> None:
    t[Q + ".g_idx"] = torch.zeros_like(t[Q + ".g_idx"])  # every input in group 0: no grouping of 32


def _narrow_q(t: dict[str, torch.Tensor]) -> None:  # a q_proj of 32 outputs where the config implies 64
    for part in ("qweight", "scales"):
        t[f"{Q}.{part}"] = t[f"{Q}.{part}"][:, :32].contiguous()
    t[Q + ".qzeros"] = t[Q + ".qzeros"][:, :4].contiguous()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda t: _tensors(t, Variant(act_order=True), _scrambled_g_idx), "g_idx does not put 32 inputs in each"),
        (lambda t: _tensors(t, Variant(bits=8, sym=False), lambda d: None), "GPTQ 8-bit with asymmetric zero points"),
        (lambda t: _tensors(t, Variant(), _narrow_q), f"{Q}.weight is [32, 64] (out, in)"),
    ],
    ids=["g-idx-no-grouping", "gptq8-asym", "shape-vs-config"],
)
def test_hostile_values_fail_the_load_in_one_line(make: Callable[[Path], Path], match: str, tmp_path: Path) -> None:
    from backends.errors import ModelFormatError

    with pytest.raises(
        ModelFormatError, match=match.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ) as err:
        _load(make(tmp_path))
    assert "\n" not in str(err.value)
