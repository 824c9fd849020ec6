"""scripts/gpu_bench.py stays runnable: its CPU dry run (tiny shapes) executes end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernels

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


def test_gpu_bench_dry_run() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--no-hf", "--batches", "1,3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for variant in ("fp16", "int8", "int4"):
        assert f"hearth {variant}" in proc.stdout
    assert "imports ok" in proc.stdout
