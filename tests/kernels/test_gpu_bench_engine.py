"""scripts/gpu_bench.py's engine rows (hearth's decoder, eager steps vs CUDA-graph replays) run in the dry run:
on CPU the graph column is DecodeGraphs' static-buffer mode under the Triton interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernels

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


def test_gpu_bench_engine_rows_dry_run() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--no-hf", "--variants", "fp16", "--batches", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("hearth engine fp16  batch   3"))
    assert "eager" in row and "static buffers, no graph (CPU)" in row and "x)" in row
    assert "imports ok" in proc.stdout
