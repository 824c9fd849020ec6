"""Fixtures of the hostile-input suite: one valid tiny GGUF (session-wide) that each test mutates as raw bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.clirun import compiled_tree
from tests.hostile.ggufraw import RawGGUF


@pytest.fixture(scope="session", autouse=True)
def _bytecode() -> None:
    """The suite measures CPU time of whole hearth commands as an installed hearth runs them: with bytecode."""
    compiled_tree()


@pytest.fixture(scope="session")
def base_gguf(tmp_path_factory: pytest.TempPathFactory, starter_path: Path) -> bytes:
    """A valid 2-layer Llama GGUF (Q8_0, the starter's tokenizer) that llama.cpp and the torch engine load."""
    from tests.gguf_factory import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("hostile") / "base.gguf", weight_type="Q8_0")
    data = path.read_bytes()
    assert RawGGUF.parse(data).to_bytes() == data  # the raw editor round-trips a real file byte for byte
    return data


@pytest.fixture
def raw(base_gguf: bytes):
    """A fresh editable copy of the base file: raw().set(...).write(path)."""
    return lambda: RawGGUF.parse(base_gguf)
