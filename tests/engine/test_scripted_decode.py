"""The scripted CPU decode loop (backends/torch_engine/scripted_decode.py) on tiny GGUFs in a real runner: the same
bits as the eager loop for int4 (Q4_1), group-wise int8 (Q8_0, two int4 halves) and per-channel int8 weights, at
one and at several rows; only decode-only steps take it; a mismatch on the first step turns it off; it stays off
where it does not apply, and says why; Qwen3's QK-norm and Gemma 3's block with its sliding windows run in it
too."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine import scripted_decode
from backends.torch_engine.model_runner import ModelRunner
from tests.arch_factory import ARCHS, write_tiny_arch
from tests.gguf_factory import write_tiny_llama

PROMPTS = [[5, 17, 200, 3, 99, 42, 7, 300, 12, 64, 81, 150, 9, 33, 71, 2, 8], [11, 23, 57, 140, 260, 31]]
TABLES = [[0, 1, 2], [3, 4, 5]]


def _spec(tmp_path, weight_type: str = "Q4_1"):  # type: ignore[no-untyped-def]
    # head_dim 32 (hidden 128, 4 heads), 2 KV heads: the GQA fold of the eager path; 3 layers
    return load_spec(
        write_tiny_llama(tmp_path / f"{weight_type}.gguf", weight_type=weight_type, hidden=128, ffn=256, n_layers=3)
    )


def _runner(spec, weight_quant: str = "gguf", kernels: str | None = None) -> ModelRunner:  # type: ignore[no-untyped-def]
    options = LoadOptions(
        n_ctx=64, max_num_seqs=2, dtype="bfloat16", device="cpu", adaptive_threads=False, weight_quant=weight_quant
    )
    return ModelRunner(spec, options, kernels)


def _decode(runner: ModelRunner, rows: int, steps: int = 6, tables: list[list[int]] = TABLES) -> list[torch.Tensor]:
    """Prefill `rows` prompts, then `steps` greedy decode-only steps; the logits of each step.  `tables`: the
    rows' blocks (TABLES: row 0's are one run of the pool, read in place, kernels.attention.head_major_run)."""
    seqs = [(PROMPTS[i], 0, tables[i]) for i in range(rows)]
    logits = runner.forward(seqs, "last", num_decodes=0)
    out = []
    for step in range(steps):
        toks = [int(t) for t in logits.argmax(-1)]
        logits = runner.forward(
            [([toks[i]], len(PROMPTS[i]) + step, tables[i]) for i in range(rows)], "last", num_decodes=rows
        )
        out.append(logits)
    return out


def _eager_decode(
    runner: ModelRunner, rows: int, steps: int = 6, tables: list[list[int]] = TABLES
) -> list[torch.Tensor]:
    """_decode with the scripted loop taken away for the call (the eager loop's logits)."""
    scripted, runner.model.scripted_decode = runner.model.scripted_decode, None
    try:
        return _decode(runner, rows, steps, tables)
    finally:
        runner.model.scripted_decode = scripted


def _assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def _count_runs(scripted) -> list[int]:  # type: ignore[no-untyped-def]
    """A list that gets an entry each time the script runs."""
    calls: list[int] = []
    original = scripted._run
    scripted._run = lambda *a: calls.append(1) or original(*a)  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize(("weight_type", "weight_quant"), [("Q4_1", "gguf"), ("Q8_0", "gguf"), ("F16", "int8")])
def test_the_scripted_loop_gives_the_eager_bits(tmp_path, weight_type: str, weight_quant: str) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path, weight_type)
    runner = _runner(spec, weight_quant)
    scripted = runner.model.scripted_decode
    assert scripted is not None, runner.describe()["scripted_decode"]
    kinds = {proj._cpu.kind for layer in runner.model.layers for proj in (layer.attn.qkv_proj, layer.mlp.down_proj)}
    assert kinds == {{"Q4_1": "int4", "Q8_0": "int8-split", "F16": "int8"}[weight_type]}
    calls = _count_runs(scripted)
    for rows in (1, 2):
        calls.clear()
        got = _decode(runner, rows)
        assert len(calls) == len(got)  # every decode step took the script (the prefill did not)
        _assert_same(got, _eager_decode(runner, rows))
    # one row whose blocks are not one run: gathered, in the script and eagerly, with the bits of the run
    scattered = [[5, 0, 3]]
    _assert_same(_decode(runner, 1, tables=scattered), _eager_decode(runner, 1, tables=scattered))
    _assert_same(_decode(runner, 1, tables=scattered), _decode(runner, 1))
    assert scripted.check == {"verdict": "ok", "rows": 1}
    assert runner.describe()["scripted_decode"] == "on"
    runner.close()


def test_split_projections_give_the_eager_bits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Q and K int4 (Q4_1) beside a Q8_0 V, an int4 gate beside a Q8_0 up: split projections (split_linear.py)
    run part by part in the script, their outputs concatenated as SplitLinear.forward does."""
    from backends.torch_engine.split_linear import SplitLinear

    path = write_tiny_llama(
        tmp_path / "mixed.gguf",
        weight_type="Q4_1",
        hidden=128,
        ffn=256,
        n_layers=3,
        tensor_types={"attn_v.weight": "Q8_0", "ffn_up.weight": "Q8_0"},
    )
    runner = _runner(load_spec(path))
    layer = runner.model.layers[0]
    assert isinstance(layer.attn.qkv_proj, SplitLinear) and isinstance(layer.mlp.gate_up_proj, SplitLinear)
    assert [p._cpu.kind for p in layer.attn.qkv_proj.parts] == ["int4", "int8-split"]
    scripted = runner.model.scripted_decode
    assert scripted is not None, runner.describe()["scripted_decode"]
    for rows in (1, 2):
        _assert_same(_decode(runner, rows), _eager_decode(runner, rows))
    assert scripted.check == {"verdict": "ok", "rows": 1}
    runner.close()


def test_qwen3_qk_norm_gives_the_eager_bits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # head_dim 64 with hidden 128 and 4 heads: Qwen3's head size is its own, not hidden / heads
    path = write_tiny_arch(tmp_path / "qwen3.gguf", "qwen3", hidden=128, ffn=256, head_dim=64, weight_type="Q8_0")
    runner = _runner(load_spec(path))
    scripted = runner.model.scripted_decode
    assert runner.model.cfg.qk_norm and scripted is not None, runner.describe()["scripted_decode"]
    for rows in (1, 2):
        _assert_same(_decode(runner, rows), _eager_decode(runner, rows))
    assert scripted.check == {"verdict": "ok", "rows": 1}
    runner.close()


def test_gemma3_block_and_sliding_window_give_the_eager_bits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Gemma 3: sandwich norms, GeGLU, QK-norm, head size 64 of hidden 128, five sliding layers (window 8, their
    # own RoPE base) to one global; the 17-token prompt and 6 steps run past the window
    path = write_tiny_arch(
        tmp_path / "gemma3.gguf",
        "gemma3",
        n_layers=6,
        hidden=128,
        ffn=256,
        head_dim=64,
        sliding_window=8,
        weight_type="Q8_0",
    )
    runner = _runner(load_spec(path))
    cfg = runner.model.cfg
    assert cfg.activation == "gelu_tanh" and cfg.rope_base_local and cfg.embed_scale != 1.0
    assert [layer.attn.window for layer in runner.model.layers] == [8] * 5 + [0]
    scripted = runner.model.scripted_decode
    assert scripted is not None, runner.describe()["scripted_decode"]
    calls = _count_runs(scripted)
    for rows in (1, 2):
        calls.clear()
        got = _decode(runner, rows, steps=8)
        assert len(calls) == len(got)
        _assert_same(got, _eager_decode(runner, rows, steps=8))
    assert scripted.check == {"verdict": "ok", "rows": 1}
    runner.close()


def test_a_step_with_a_prompt_chunk_runs_eagerly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(_spec(tmp_path))
    scripted = runner.model.scripted_decode
    runner.forward([(PROMPTS[0], 0, TABLES[0])], "last", num_decodes=0)
    calls = _count_runs(scripted)
    # one decode row beside a prompt chunk: a mixed step, the eager loop
    runner.forward([([7], len(PROMPTS[0]), TABLES[0]), (PROMPTS[1], 0, TABLES[1])], "last", num_decodes=1)
    # a decode row on the dense copies (num_decodes 0): eager too
    runner.forward([([7], len(PROMPTS[0]) + 1, TABLES[0])], "last", num_decodes=0)
    assert calls == []
    runner.forward([([7], len(PROMPTS[0]) + 2, TABLES[0])], "last", num_decodes=1)
    assert calls == [1]
    runner.close()


def test_a_first_step_that_differs_turns_it_off(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(_spec(tmp_path))
    scripted = runner.model.scripted_decode
    want = _eager_decode(runner, 1, steps=3)
    original = scripted._run

    def off_by_a_bit(*args):  # type: ignore[no-untyped-def]
        x, residual = original(*args)
        return x + 1, residual

    scripted._run = off_by_a_bit  # type: ignore[method-assign]
    _assert_same(_decode(runner, 1, steps=3), want)  # the eager result is what the first step returned, and after
    assert scripted.check["verdict"] == "mismatch"
    said = runner.describe()["scripted_decode"]
    assert said.startswith("off (checked against the eager loop on its first step: max difference")
    runner.close()


def test_a_script_that_raises_on_its_first_step_turns_it_off(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(_spec(tmp_path))
    scripted = runner.model.scripted_decode
    want = _eager_decode(runner, 1, steps=2)

    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no such op")

    scripted._run = broken  # type: ignore[method-assign]
    _assert_same(_decode(runner, 1, steps=2), want)  # the request goes on, eagerly
    assert scripted.check == {"verdict": "mismatch", "rows": 1, "detail": "the script failed: RuntimeError: no such op"}
    assert "the script failed" in runner.describe()["scripted_decode"]
    runner.close()


def test_where_it_does_not_apply_it_says_why(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    reference = _runner(spec, kernels="reference")
    assert reference.model.scripted_decode is None
    assert reference.describe()["scripted_decode"] == "off (only bf16 on the CPU's torch kernels)"
    reference.close()
    monkeypatch.setenv(scripted_decode.ENV_VAR, "0")
    runner = _runner(spec)
    assert runner.model.scripted_decode is None
    assert runner.describe()["scripted_decode"] == f"off ({scripted_decode.ENV_VAR}=0)"
    runner.close()


class _Ops(TorchDispatchMode):
    """The ATen ops a block of code runs (TorchScript's interpreter goes through the dispatcher too)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


# Ops that compute nothing: views, and the eager kernels' output allocations (the script writes in place or
# returns fresh tensors instead)
_NOT_COMPUTE = {"empty", "empty_like", "new_empty", "detach", "alias"}


def _compute_ops(runner: ModelRunner, token: int, position: int) -> Counter[str]:
    with _Ops() as recorded:
        runner.forward([([token], position, TABLES[0])], "last", num_decodes=1)
    return Counter(op._opname for op in recorded.ops if not op.is_view and op._opname not in _NOT_COMPUTE)


def _tiny(tmp_path, architecture: str):  # type: ignore[no-untyped-def]
    if architecture == "llama":
        return write_tiny_llama(tmp_path / "llama.gguf", weight_type="Q4_1", hidden=128, ffn=256, n_layers=3)
    extra = {"gemma3": {"n_layers": 6, "sliding_window": 8}}.get(architecture, {})
    return write_tiny_arch(
        tmp_path / f"{architecture}.gguf", architecture, hidden=128, ffn=256, head_dim=64, weight_type="Q8_0", **extra
    )


@pytest.mark.parametrize("architecture", ["llama", *ARCHS])
def test_the_script_runs_the_ops_of_the_one_forward_definition(tmp_path, architecture: str) -> None:  # type: ignore[no-untyped-def]
    """The guard against drift between models/layers.py (the one forward definition) and the script's copy of it:
    for every architecture the tiny factories write, a decode step through the script runs the same ATen ops, as
    many of each, as the same step through the eager Block.forward, and gives its bits.  A new op in a block (even
    one that changes nothing on these tiny models, such as a scale of 1) fails here until the script has it too,
    or until unavailable_reason sends that model to the eager path, saying why."""
    runner = _runner(load_spec(_tiny(tmp_path, architecture)))
    scripted = runner.model.scripted_decode
    if scripted is None:  # a model the script does not take says why, and runs eagerly
        assert runner.describe()["scripted_decode"].startswith("off ("), architecture
        runner.close()
        return
    logits = runner.forward([(PROMPTS[0], 0, TABLES[0])], "last", num_decodes=0)
    token, position = int(logits.argmax(-1)[0]), len(PROMPTS[0])
    runner.forward([([token], position, TABLES[0])], "last", num_decodes=1)  # the first step checks the bits
    assert scripted.check == {"verdict": "ok", "rows": 1}
    calls = _count_runs(scripted)
    through_script = _compute_ops(runner, token, position + 1)
    assert calls == [1]
    runner.model.scripted_decode = None
    eager = _compute_ops(runner, token, position + 2)
    runner.model.scripted_decode = scripted
    assert through_script == eager, (
        f"only in the script: {dict(through_script - eager)}; only in the eager step: {dict(eager - through_script)}"
    )
    runner.close()
