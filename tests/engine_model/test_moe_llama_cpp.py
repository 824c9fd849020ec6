"""llama.cpp tensor buffer overrides (backends/llama_cpp/overrides.py): the plan's cpu_expert_layers pins the
first blocks' routed experts to the CPU buffer type, as `--n-cpu-moe N` does, and changes nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from backends.api import LoadOptions
from backends.errors import ConfigError
from backends.llama_cpp.backend import LlamaCppBackend
from backends.llama_cpp.overrides import cpu_expert_overrides, cpu_expert_pattern
from backends.modelspec import load_spec
from tests.moe_gguf_factory import write_tiny_moe


def test_pattern_matches_the_first_blocks_routed_experts_only() -> None:
    pattern = re.compile(cpu_expert_pattern(3) or "")
    assert pattern.search("blk.0.ffn_up_exps.weight") and pattern.search("blk.2.ffn_down_exps.weight")
    assert pattern.search("blk.1.ffn_gate_exps.weight")
    for name in (
        "blk.3.ffn_up_exps.weight",
        "blk.12.ffn_up_exps.weight",
        "blk.1.ffn_up_shexp.weight",
        "blk.0.ffn_gate_inp.weight",
        "blk.0.attn_q.weight",
    ):
        assert not pattern.search(name), name
    assert cpu_expert_pattern(0) is None and cpu_expert_overrides(0) is None


def test_overrides_array_is_null_terminated_with_the_cpu_buffer_type() -> None:
    o = cpu_expert_overrides(2)
    assert o is not None
    (pattern, buft), terminator = o.entries()
    assert pattern == cpu_expert_pattern(2) and buft
    assert terminator == (None, None)


def test_negative_cpu_expert_layers_is_refused() -> None:
    with pytest.raises(ConfigError, match="cpu_expert_layers"):
        LoadOptions(cpu_expert_layers=-1)


def test_llama_cpp_keeps_the_first_blocks_experts_on_the_cpu_and_gives_the_same_logits(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = write_tiny_moe(tmp_path / "moe.gguf", "qwen2moe", n_layers=3)
    spec = load_spec(path)
    ids = [1, 5, 300, 400, 17]
    plain = LlamaCppBackend(spec, LoadOptions(n_ctx=64, n_threads=2, logits_all=True))
    plain.load()
    want = np.array(plain.logits(ids))
    plain.close()
    placed = LlamaCppBackend(
        spec, LoadOptions(n_ctx=64, n_threads=2, cpu_expert_layers=2, verbose=True, logits_all=True)
    )
    capfd.readouterr()
    placed.load()
    log = capfd.readouterr().err
    got = np.array(placed.logits(ids))
    info = placed.describe()
    placed.close()
    overridden = set(re.findall(r"tensor (blk\.\d+\.ffn_\w+_exps)\.weight .*buffer type overridden to CPU", log))
    assert overridden == {f"blk.{i}.ffn_{p}_exps" for i in (0, 1) for p in ("gate", "up", "down")}
    assert info["cpu_expert_layers"] == 2 and info["tensor_buft_overrides"].endswith("=CPU")
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_dense_model_ignores_cpu_expert_layers_and_says_so(tmp_path: Path) -> None:
    from tests.gguf_factory import write_tiny_llama

    spec = load_spec(write_tiny_llama(tmp_path / "dense.gguf", tokenizer="spm"))
    b = LlamaCppBackend(spec, LoadOptions(n_ctx=64, n_threads=2, cpu_expert_layers=2))
    b.load()
    info = b.describe()
    b.close()
    assert info["cpu_expert_layers"] == 0 and any("no experts" in n for n in info["notes"])
