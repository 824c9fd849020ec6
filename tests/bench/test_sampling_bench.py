"""scripts/sampling_bench.py keeps working: a tiny run on the starter model through the server reports every
mode of every round and the per-round ratios (no timing is asserted: the numbers belong to the machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sampling_bench_runs_every_mode_and_reports_ratios(starter_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sampling.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "sampling_bench.py"), "--clients", "2", "--gen", "3"]
    p = subprocess.run(
        [*cmd, "--rounds", "1", "--prompt-words", "8", "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["rows"]] == ["greedy", "t=0.8", "t=0.8+seed"]
    assert all(r["tokens"] == 2 * 3 and r["tokens_per_s"] > 0 for r in data["rows"])
    assert set(data["ratios"]) == {"t=0.8", "t=0.8+seed"} and all(len(v) == 1 for v in data["ratios"].values())
