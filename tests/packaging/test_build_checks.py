"""packaging/build.py's checks find what a broken distribution would ship: junk, missing modules or package data,
no console script, a RECORD hash that does not match, invalid metadata (fast: hand-made archives)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hearth_packaging_build", ROOT / "packaging" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)  # type: ignore[union-attr]

METADATA = (
    "Metadata-Version: 2.4\nName: hearth-llm\nVersion: 0.1.0\nSummary: x\nRequires-Python: >=3.10\n"
    "Description-Content-Type: text/markdown\n\n# hearth\n\ntext\n"
)
INFO = "hearth_llm-0.1.0.dist-info"


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    path: Path,
    *,
    drop: str | None = None,
    extra: dict[str, bytes] | None = None,
    metadata: str = METADATA,
    entry: str = "[console_scripts]\nhearth = app.cli:main\n",
    bad_hash: str | None = None,
) -> Path:
    files = {m: (ROOT / m).read_bytes() for m in build._modules() if m != drop}
    files.update(extra or {})
    files[f"{INFO}/METADATA"] = metadata.encode()
    files[f"{INFO}/entry_points.txt"] = entry.encode()
    record = "".join(f"{n},{'sha256=AAAA' if n == bad_hash else _hash(d)},{len(d)}\n" for n, d in files.items())
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{INFO}/RECORD", record + f"{INFO}/RECORD,,\n")
    return path


def test_a_good_wheel_has_no_problems(tmp_path: Path) -> None:
    assert build.check_wheel(make_wheel(tmp_path / "hearth_llm-0.1.0-py3-none-any.whl")) == []


@pytest.mark.parametrize(
    "kwargs,problem",
    [
        ({"extra": {"tests/test_x.py": b""}}, "junk tests/test_x.py"),
        ({"extra": {"app/__pycache__/cli.cpython-311.pyc": b""}}, "junk app/__pycache__"),
        ({"drop": "app/tui/hearth.tcss"}, "missing app/tui/hearth.tcss"),
        ({"drop": "backends/runner/child.py"}, "missing backends/runner/child.py"),
        ({"entry": "[console_scripts]\n"}, "no `hearth = app.cli:main` console script"),
        ({"bad_hash": "app/cli.py"}, "RECORD hash of app/cli.py does not match"),
        ({"metadata": METADATA.replace("Name: hearth-llm", "Name: hearth llm!")}, "metadata does not validate"),
        ({"metadata": METADATA.replace("text/markdown", "text/plain")}, "not the Markdown README"),
    ],
)
def test_each_problem_is_named(tmp_path: Path, kwargs: dict, problem: str) -> None:
    problems = build.check_wheel(make_wheel(tmp_path / "hearth_llm-0.1.0-py3-none-any.whl", **kwargs))
    assert any(problem in p for p in problems), problems
