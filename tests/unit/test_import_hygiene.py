"""STYLE rule 6: the CLI, the probe and the core load without torch, triton, llama_cpp or textual."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "triton", "llama_cpp", "textual")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return {m.split(".")[0] for m in out.stdout.split()}


@pytest.mark.parametrize("code", [
    "from app.cli import build_parser; build_parser()",
    "import backends.api, backends.registry, backends.modelspec, backends.templates, backends.textstream",
    "import app.store, app.settings, app.loading, app.chat_session",
    "import hwprobe",
])
def test_core_imports_stay_light(code: str) -> None:
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY), f"{code!r} imported {sorted(loaded & set(HEAVY))}"


def test_help_and_version_do_not_import_heavy_libraries() -> None:
    code = ("import sys\nfrom app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\nmain(['--version'])")
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY)
