"""scripts/moe_bench.py runs end to end (tiny shapes, CPU): the benchmark the issue asks for stays working."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def test_moe_bench_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "moe_bench.py"
    spec = importlib.util.spec_from_file_location("moe_bench", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--dry-run", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "torch grouped" in out and "x)" in out
