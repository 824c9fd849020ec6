"""The layering is enforced: `lint-imports` (pyproject's [tool.importlinter]) and scripts/import_cycles.py pass on
this tree, and fail on a copy of it with deliberate breaks, made (as lazy code hides them) inside functions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "backends", "hwprobe", "kernels")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy(tmp_path: Path) -> Path:
    """The four packages' sources (no caches), pyproject.toml and the cycle script, in a fresh folder."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "import_cycles.py", tmp_path / "scripts" / "import_cycles.py")
    return tmp_path


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # the copy's packages, not the installed checkout
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _inject(path: Path, statement: str) -> None:
    """`statement` inside a new function at the end of `path`: the lazy kind of import the contracts count."""
    with path.open("a") as f:
        f.write(f"\n\ndef _deliberate_break() -> None:\n    {statement}  # noqa\n")


def test_contracts_hold_on_this_tree() -> None:
    result = _run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_import_cycles_on_this_tree() -> None:
    result = _run([sys.executable, "scripts/import_cycles.py"], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_deliberate_break_of_each_contract_is_caught(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    _inject(tree / "hwprobe" / "planner.py", "import backends.api")  # a lower layer importing a higher one
    _inject(tree / "backends" / "llama_cpp" / "tokens.py", "import backends.torch_engine.sampler")  # engines
    _inject(tree / "backends" / "remote" / "tool_text.py", "import backends.runner.client")  # engine -> runner
    _inject(tree / "app" / "versions.py", "import backends.llama_cpp.backend")  # app around the contract
    _inject(tree / "app" / "paths.py", "import torch")  # the app's process never loads torch
    _inject(tree / "backends" / "torch_engine" / "scheduler.py", "import torch")  # the pure-Python core
    _inject(tree / "kernels" / "rope.py", "import textual")
    result = _run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], tree)
    assert result.returncode != 0
    report = result.stdout
    assert "Contracts: 0 kept, 7 broken." in report, report
    for where in (
        "hwprobe.planner -> backends.api",
        "backends.llama_cpp.tokens -> backends.torch_engine.sampler",
        "backends.remote.tool_text -> backends.runner.client",
        "app.versions -> backends.llama_cpp.backend",
        "app.paths -> torch",
        "backends.torch_engine.scheduler -> torch",
        "kernels.rope -> textual",
    ):
        assert where in report, f"{where} not reported:\n{report}"


def test_a_deliberate_cycle_is_caught(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    # app.paths is imported by app.store at the top; a lazy import back closes the loop
    _inject(tree / "app" / "paths.py", "import app.store")
    result = _run([sys.executable, "scripts/import_cycles.py"], tree)
    assert result.returncode == 1
    assert "import cycle: app.paths -> app.store -> app.paths" in result.stdout, result.stdout


def test_a_deliberate_package_cycle_inside_the_torch_engine_is_caught(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    # model_runner imports tp.layers; tp/__init__.py importing model_runner closes a loop between the package tp
    # and model_runner that no single module closes (nothing model_runner reaches imports tp/__init__.py)
    _inject(tree / "backends" / "torch_engine" / "tp" / "__init__.py", "import backends.torch_engine.model_runner")
    result = _run([sys.executable, "scripts/import_cycles.py", "backends"], tree)
    assert result.returncode == 1
    assert "import cycle:" not in result.stdout, result.stdout  # no module-level loop: only the package one
    assert "package cycle inside backends.torch_engine: " in result.stdout, result.stdout
    assert "backends.torch_engine.model_runner" in result.stdout and "backends.torch_engine.tp," in result.stdout


def test_every_import_inside_a_function_says_why_on_this_tree() -> None:
    result = _run([sys.executable, "scripts/lazy_imports.py"], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_bare_import_inside_a_function_is_caught(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    shutil.copy(ROOT / "scripts" / "lazy_imports.py", tree / "scripts" / "lazy_imports.py")
    _inject(tree / "app" / "paths.py", "import app.store")  # the noqa comment it gets is no reason
    with (tree / "hwprobe" / "memory.py").open("a") as f:  # a reason on the line above is enough
        f.write("\n\ndef _with_a_reason() -> None:\n    # lazy: a reason\n    import json\n")
    result = _run([sys.executable, "scripts/lazy_imports.py"], tree)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("app/paths.py:") and lines[0].endswith("import app.store  # noqa")
    assert "without a reason" in result.stderr


def test_the_lazy_marker_wants_a_reason() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lazy_imports import bare_lazy_imports
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    source = (
        "import os\n\n"  # module level: never counted
        "def f():\n"
        "    import json  # lazy:\n"  # a marker without a reason
        "    import re  # lazy: a reason\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from app import paths\n"  # a method's import counts
        "    async def h():\n"
        "        # lazy: heavy: torch\n"
        "        import torch\n"
        "        import triton\n"  # the reason above is torch's, not this one's
        "        # lazy: a reason that takes\n"
        "        # two lines\n"
        "        import numpy\n"
    )
    assert bare_lazy_imports(source) == [
        (4, "import json  # lazy:"),
        (8, "from app import paths"),
        (12, "import triton"),
    ]
