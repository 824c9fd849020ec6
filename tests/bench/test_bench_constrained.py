"""scripts/bench_constrained.py keeps working: a tiny run on the starter model writes every figure (no timing
is asserted: the numbers belong to the machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_constrained_runs_and_reports_both_kinds(starter_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_constrained.py"),
            "--concurrency",
            "1",
            "2",
            "--gen",
            "4",
            "--rounds",
            "1",
            "--threads",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["results"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["free_tokens_per_s"] > 0 and r["constrained_tokens_per_s"] > 0 and "overhead_pct" in r
