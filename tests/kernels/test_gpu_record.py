"""scripts/gpu_record.py (gpu_bench.py --record, issue 42 item 4) on CPU: its record writer puts the issue's keys
and types in the JSON, and its random Q4_K_M GGUF has llama.cpp's types, finite small weights and the 8B size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.script_module import load_script

pytestmark = pytest.mark.kernels


def _script(name: str):
    return load_script(f"scripts/{name}.py")


def test_record_writer_keys_and_types(tmp_path: Path) -> None:
    import torch

    record_mod = _script("gpu_record")
    record = record_mod.Record(tmp_path, "cpu-dry-run", 31.5)
    shape = record_mod.SHAPES_TINY[:1]
    record_mod.kernel_rows(record, shape, (1,), torch.device("cpu"), torch.float32, strict=True)
    record.end_to_end("torch", "Q4_K_M", 1, 123.456)

    data = json.loads(record.path.read_text())
    assert record.path.name == f"{data['date']}-cpu-dry-run.json"
    assert {k: type(v) for k, v in data.items()} == {
        "gpu": str,
        "date": str,
        "copy_gbps": float,
        "kernels": list,
        "end_to_end": list,
    }
    kernels = {(r["layout"], r["kernel"]) for r in data["kernels"]}
    assert kernels == {
        ("int4", "hearth"),
        ("int4", "old"),
        ("int8", "hearth"),
        ("int8", "old"),
        ("q6", "hearth"),
        ("q6", "old"),
        ("int4", "tinygemm"),
        ("bf16", "cublas"),
    }
    for row in data["kernels"]:
        assert list(row) == ["layout", "shape", "m", "kernel", "gbps"]
        assert row["shape"] == "qkv 128x256" and row["m"] == 1 and isinstance(row["gbps"], float) and row["gbps"] > 0
    assert data["end_to_end"] == [{"engine": "torch", "format": "Q4_K_M", "streams": 1, "tokens_per_s": 123.5}]
    table = record_mod.markdown_table(data)
    assert "| int4 | qkv 128x256 | hearth | " in table and "| torch | Q4_K_M | 1 | 123.5 |" in table


def test_check_record_refuses_other_keys_and_types() -> None:
    record_mod = _script("gpu_record")
    good = {"gpu": "g", "date": "d", "copy_gbps": 1.0, "kernels": [], "end_to_end": []}
    record_mod.check_record(good)
    with pytest.raises(ValueError, match="copy_gbps is int"):
        record_mod.check_record({**good, "copy_gbps": 1})
    with pytest.raises(ValueError, match="keys"):
        record_mod.check_record({**good, "kernels": [{"layout": "int4", "shape": "s", "m": 1, "kernel": "hearth"}]})
    with pytest.raises(ValueError, match="streams is bool"):
        row = {"engine": "torch", "format": "bf16", "streams": True, "tokens_per_s": 1.0}
        record_mod.check_record({**good, "end_to_end": [row]})


def test_random_q4_k_m_gguf(tmp_path: Path) -> None:
    import gguf

    maker = _script("make_random_gguf")
    path = maker.write_random_q4_k_m(tmp_path / "tiny.gguf", maker.TINY)
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    # llama.cpp's Q4_K_M: of 2 layers, use_more_bits picks layer 1 for attn_v and ffn_down
    assert types["blk.0.attn_v.weight"] == "Q4_K" and types["blk.1.attn_v.weight"] == "Q6_K"
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K" and types["blk.0.attn_norm.weight"] == "F32"
    for t in reader.tensors:
        if t.tensor_type.name in ("Q4_K", "Q6_K"):
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            assert np.isfinite(w).all() and np.abs(w).max() < 0.2 and 0.005 < w.std() < 0.05, t.name
    # the 8B shape's tensors add up to a real Llama-3-8B Q4_K_M's 4.92 GB, less its tokenizer and metadata
    total = sum(
        d[0] * 4 if t == "F32" else d[0] * d[1] // 256 * maker.BLOCK[t][0]
        for _, t, d in maker.tensor_plan(maker.LLAMA3_8B)
    )
    assert total == 4_912_898_048


def test_a_compressed_llama_bench_unpacks_to_a_runnable_binary(tmp_path: Path) -> None:
    """scripts/build_llama_bench.sh carries llama-bench as .xz (67.8 MB stripped is over the 64 MiB that travels);
    gpu_record.runnable unpacks it with Python's lzma, executable; a plain binary is used as it is."""
    import lzma
    import subprocess

    record_mod = _script("gpu_record")
    packed = tmp_path / "llama-bench.xz"
    packed.write_bytes(lzma.compress(b"#!/bin/sh\necho tg128 ok\n"))
    (tmp_path / "run").mkdir()
    binary = record_mod.runnable(packed, tmp_path / "run")
    assert binary == tmp_path / "run" / "llama-bench"
    assert subprocess.run([binary], capture_output=True, text=True, check=True).stdout == "tg128 ok\n"
    assert record_mod.runnable(binary, tmp_path) == binary
    assert record_mod.LLAMA_BENCH.name == "llama-bench.xz"
