"""scripts/gpu_bench.py's TP row runs in the dry run: 2 gloo ranks on the CPU against one rank, same greedy
tokens (on a machine with two GPUs the row runs by itself, over NCCL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"


def test_gpu_bench_tp_row_dry_run() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--dry-run",
            "--no-hf",
            "--no-engine",
            "--variants",
            "fp16",
            "--batches",
            "1,3",
            "--tensor-parallel",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("TP=2 (gloo, CPU)")]
    assert [r.split("batch")[1].split(":")[0].strip() for r in rows] == ["1", "3"]
    assert all("tok/s vs one rank" in r and "greedy tokens agree" in r for r in rows)
    assert "imports ok" in proc.stdout  # the TP row comes after the import check
