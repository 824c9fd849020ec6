"""The wheel builds, installs into a fresh venv and gives a working `hearth` command."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_runs() -> None:
    p = subprocess.run(["bash", str(ROOT / "packaging" / "check_wheel.sh")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "hearth 0.1.0" in p.stdout and "packages ok" in p.stdout
