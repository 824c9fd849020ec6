"""scripts/cold_start_bench.py keeps working: one round on the starter model reports torch with an empty and a
filled prepared-weight cache, llama.cpp, and both answering from a runner left loaded, every run exiting 0 (no
timing is asserted: the numbers belong to the machine), the starter's prepared weights left in the cache as one
entry, and no runner left loaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cold_start_bench_reports_every_kind(starter_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "cold.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "cold_start_bench.py"), "--rounds", "1", "--json", str(out)]
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "HEARTH_WEIGHT_CACHE": "1"}
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert [(r["backend"], r["cache"]) for r in data["rows"]] == [
        ("torch", "cold cache"),
        ("torch", "warm cache"),
        ("llama.cpp", ""),
        ("torch", "resident"),  # a run answered by the runner an earlier run left loaded (--keep-alive)
        ("llama.cpp", "resident"),
    ]
    assert all(r["runs"] == 1 and r["wall_median_s"] > 0 and r["peak_rss_median_mib"] > 0 for r in data["rows"])
    weights = Path(os.environ["HEARTH_HOME"]) / "cache" / "weights"
    assert len(list(weights.glob("*.pt"))) == 1  # the cold run stored the starter's entry, the warm one kept it
    from app.paths import get_paths
    from backends.runner.resident import resident_dir, residents

    assert residents(resident_dir(get_paths().data_dir)) == []  # the script stopped what it left loaded
