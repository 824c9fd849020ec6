"""Issue 42 item 5: a GPU record fed to the planner (scripts/gpu_record_table.py -> hwprobe/recorded_rows.py ->
hwprobe/decode_speed.TABLE): the rows a record gives, their split of the mixed Q4_K_M figure by the kernels' GB/s,
the planner's use of them, and recorded_rows.py kept up to date with bench/gpu/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwprobe import decode_speed
from hwprobe.decode_speed import Measured, efficiency, mixed_share
from tests.script_module import load_script

SHAPES = ("qkv 6144x4096", "o 4096x4096", "gate_up 28672x4096", "down 4096x14336")


def _table():
    return load_script("scripts/gpu_record_table.py")


def _record(gpu: str = "NVIDIA H100 80GB HBM3") -> dict:
    kernels = [
        {"layout": layout, "shape": shape, "m": m, "kernel": "hearth", "gbps": gbps * (1 if m == 1 else 0.9)}
        for layout, gbps in (("int4", 2400.0), ("int8", 2600.0), ("q6", 2000.0))
        for shape in SHAPES
        for m in (1, 16)
    ]
    kernels.append({"layout": "bf16", "shape": SHAPES[0], "m": 1, "kernel": "cublas", "gbps": 2900.0})
    e2e = [
        {"engine": "llama.cpp", "format": "Q4_K_M", "streams": 1, "tokens_per_s": 160.0},
        {"engine": "torch", "format": "Q4_K_M", "streams": 1, "tokens_per_s": 170.0},
        {"engine": "torch", "format": "Q4_K_M", "streams": 16, "tokens_per_s": 1500.0},
        {"engine": "torch", "format": "bf16", "streams": 1, "tokens_per_s": 90.0},
        {"engine": "torch", "format": "bf16", "streams": 16, "tokens_per_s": 1300.0},
    ]
    return {"gpu": gpu, "date": "2026-12-07", "copy_gbps": 3000.0, "kernels": kernels, "end_to_end": e2e}


def test_recorded_rows_are_what_the_committed_records_give() -> None:
    assert _table().main(["--check"]) == 0


def test_a_record_gives_each_engine_and_kind_its_row() -> None:
    table = _table()
    gen, rows = table.table_rows(_record(), "bench/gpu/x.json")
    assert gen == "hopper" and set(rows) == {
        ("llama.cpp", "ggml"),
        ("torch", "16bit"),
        ("torch", "int4"),
        ("torch", "int8"),
        ("torch", "q6"),
    }
    read = table.bytes_per_token()
    assert read["llama.cpp"] == pytest.approx(4_912_898_048 - 128256 * 4096 // 256 * 144)  # the file but its embedding
    ggml = Measured(*rows["llama.cpp", "ggml"])
    assert (ggml.tokens_per_s, ggml.bandwidth_gbps, ggml.bytes_per_token) == (160.0, 3350.0, read["llama.cpp"])
    assert "on an NVIDIA H100 80GB HBM3 (2026-12-07, bench/gpu/x.json)" in ggml.source
    assert Measured(*rows["torch", "16bit"]).batch16 == pytest.approx(1300 / 90, rel=1e-3)
    int4, int8, q6 = (Measured(*rows["torch", k]) for k in ("int4", "int8", "q6"))
    # the kinds keep the kernels' ratios, and their mix over the file's bytes takes the measured time a token
    assert int4.share / q6.share == pytest.approx(2400 / 2000, rel=1e-3)
    assert int8.share / int4.share == pytest.approx(2600 / 2400, rel=1e-3)
    mixed = mixed_share(
        [
            (read["int4"], efficiency("x", "y", None, (_rec(int4),))),
            (read["q6"], efficiency("x", "y", None, (_rec(q6),))),
        ]
    )
    whole = Measured(170.0, read["int4"] + read["q6"] + read["f32"], 32, 3350.0, "").share
    assert mixed.share == pytest.approx(whole, rel=2e-3)
    assert int4.batch16 == pytest.approx(1500 / 170, rel=1e-3) and q6.batch16 == pytest.approx(1500 / 170, rel=1e-3)


def _rec(m: Measured):
    """A decode record (engine "x", kind "y") of a Measured's share, for efficiency()."""

    class R:
        engine, kind, share, batch16, source = "x", "y", m.share, m.batch16, m.source

    return R()


def test_the_planner_takes_the_recorded_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table()
    (tmp_path / "2026-12-07-h100.json").write_text(json.dumps(_record()))
    rows = table.all_rows(tmp_path)
    monkeypatch.setattr(decode_speed, "TABLE", decode_speed.with_recorded(decode_speed.TABLE, rows))
    for kind in ("int4", "q6", "16bit"):
        e = efficiency("torch", kind, (9, 0))
        assert e.source.startswith("table: scripts/gpu_bench.py --record on an NVIDIA H100"), kind
        assert e.share == pytest.approx(Measured(*rows["torch", kind]["hopper"]).share)
    assert "NVIDIA H100" in efficiency("llama.cpp", "ggml", (9, 0)).source
    assert "H100" not in efficiency("torch", "fp8", (9, 0)).source  # nothing recorded: the hand-entered row
    assert "--record" in efficiency("torch", "q6", (8, 9)).source  # ada takes hopper's, the nearest, and says so


def test_a_record_of_an_unknown_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="not in hwprobe/gpus.py"):
        _table().table_rows(_record("Some Future Accelerator"))
