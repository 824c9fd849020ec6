"""backends/gguf_constants.py: gguf's tables without the gguf package's import (numpy, yaml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf.constants

from backends.gguf_constants import constants

ROOT = Path(__file__).resolve().parents[2]


def test_the_tables_are_gguf_s_own() -> None:
    ours = constants()
    assert ours is not gguf.constants  # loaded alone, not the package's module
    assert {t.name: t.value for t in ours.GGMLQuantizationType} == {
        t.name: t.value for t in gguf.constants.GGMLQuantizationType
    }
    assert {t.name: v for t, v in ours.GGML_QUANT_SIZES.items()} == {
        t.name: v for t, v in gguf.constants.GGML_QUANT_SIZES.items()
    }
    assert {t.name: t.value for t in ours.LlamaFileType} == {t.name: t.value for t in gguf.constants.LlamaFileType}


def test_reading_a_header_imports_neither_gguf_nor_numpy(starter_path: Path) -> None:
    code = (
        "import sys\n"
        "from backends.modelspec import load_spec\n"
        f"spec = load_spec({str(starter_path)!r})\n"
        "assert spec.file_type == 'Q4_1' and spec.tensor_types['Q8_0'] == 1, spec.tensor_types\n"
        "print(sorted(m for m in ('numpy', 'gguf', 'yaml') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
