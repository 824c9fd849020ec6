"""scripts/moe_bench.py runs end to end (tiny shapes, CPU): the benchmark the issue asks for stays working."""

from __future__ import annotations

import pytest

from tests.script_module import load_script


def test_moe_bench_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script("scripts/moe_bench.py")
    assert module.main(["--dry-run", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "torch grouped" in out and "x)" in out
