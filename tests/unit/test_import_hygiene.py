"""STYLE rule 6: the CLI, the probe and the core load without torch, triton, llama_cpp or textual."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "triton", "llama_cpp", "textual")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {m.split(".")[0] for m in out.stdout.split()}


@pytest.mark.parametrize(
    "code",
    [
        "from app.cli import build_parser; build_parser()",
        "import backends.api, backends.registry, backends.modelspec, backends.templates, backends.textstream",
        "import app.store, app.settings, app.loading, app.chat_session",
        "import hwprobe",
        "import backends.runner.client, backends.runner.protocol, backends.runner.ladder, backends.runner.memory",
    ],
)
def test_core_imports_stay_light(code: str) -> None:
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY), f"{code!r} imported {sorted(loaded & set(HEAVY))}"


def test_backends_core_does_not_import_the_torch_engine() -> None:
    """docs/ARCHITECTURE.md's arrows: the torch engine imports backends' core, never the other way round, not even
    lazily inside a function (the registry names engines by string and imports them on demand)."""
    import ast
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "backends"
    offenders = []
    for f in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{f.name}: {n}" for n in names if n.startswith("backends.torch_engine")]
    assert not offenders, offenders


def test_help_and_version_do_not_import_heavy_libraries() -> None:
    code = (
        "import sys\nfrom app.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\nmain(['--version'])"
    )
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY)


def test_the_app_process_never_imports_an_engine_when_the_model_runs_in_a_runner(tmp_path) -> None:
    """With runners, torch and llama_cpp live in the runner; hearth's own process stays small."""
    code = (
        "import os\nos.environ['HEARTH_HOME'] = %r\nfrom app.loading import open_backend\n"
        "from app.settings import Settings\nfrom backends.api import Request, SamplingParams\n"
        "loaded = open_backend(Settings(backend='llama.cpp', ctx=256))\n"
        "print(loaded.backend.generate(Request(prompt='Hi', sampling=SamplingParams(max_tokens=2))).finish_reason,"
        " file=__import__('sys').stderr)\nloaded.backend.close()"
    ) % str(tmp_path)
    loaded = _modules_after(code)
    assert not loaded & {"torch", "llama_cpp"}
