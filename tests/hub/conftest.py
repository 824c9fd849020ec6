"""Fixtures for the hub tests: a FakeHub server, huggingface_hub pointed at it and online, tiny GGUF files."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tests.hub.hubserver import FakeHub


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)  # app.hub reads it per call and passes endpoint= explicitly
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # tests/conftest.py sets it for every other test
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 5)
    # hf hands the file 10 MiB chunks; our files are a few MiB, so a dropped transfer would keep nothing to resume.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    yield server
    server.close()


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """quant name -> bytes of a tiny Llama GGUF (real files: their weight types differ, so do their sizes)."""
    from tests.gguf_factory import write_tiny_llama

    d = tmp_path_factory.mktemp("tiny-ggufs")
    out = {}
    for quant, wtype in (("F16", "F16"), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4_0")):
        p = write_tiny_llama(
            d / f"tiny-{quant}.gguf", weight_type=wtype, n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=64
        )
        out[quant] = p.read_bytes()
    return out


@pytest.fixture(scope="session")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The shards of a split tiny GGUF: file name -> bytes."""
    import gguf

    from tests.gguf_factory import write_tiny_llama

    d = tmp_path_factory.mktemp("tiny-split")
    original = gguf.GGUFWriter
    gguf.GGUFWriter = functools.partial(original, split_max_tensors=4)  # type: ignore[misc]
    try:
        write_tiny_llama(
            d / "tiny-Q8_0.gguf", weight_type="Q8_0", n_layers=2, hidden=32, n_heads=2, n_kv_heads=1, ffn=64
        )
    finally:
        gguf.GGUFWriter = original  # type: ignore[misc]
    shards = sorted(Path(d).glob("*-of-*.gguf"))
    assert len(shards) >= 2, [p.name for p in Path(d).iterdir()]
    return {p.name: p.read_bytes() for p in shards}
