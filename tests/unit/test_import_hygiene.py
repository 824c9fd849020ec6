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
    "import backends.runner.client, backends.runner.protocol, backends.runner.ladder, backends.runner.memory",
])
def test_core_imports_stay_light(code: str) -> None:
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY), f"{code!r} imported {sorted(loaded & set(HEAVY))}"


def test_help_and_version_do_not_import_heavy_libraries() -> None:
    code = ("import sys\nfrom app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\nmain(['--version'])")
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY)


def test_the_app_process_never_imports_an_engine_when_the_model_runs_in_a_runner(tmp_path) -> None:
    """With runners, torch and llama_cpp live in the runner; hearth's own process stays small."""
    code = ("import os\nos.environ['HEARTH_HOME'] = %r\nfrom app.loading import open_backend\n"
            "from app.settings import Settings\nfrom backends.api import Request, SamplingParams\n"
            "loaded = open_backend(Settings(backend='llama.cpp', ctx=256))\n"
            "print(loaded.backend.generate(Request(prompt='Hi', sampling=SamplingParams(max_tokens=2))).finish_reason,"
            " file=__import__('sys').stderr)\nloaded.backend.close()") % str(tmp_path)
    loaded = _modules_after(code)
    assert not loaded & {"torch", "llama_cpp"}
