"""A file of the repository that is no package (scripts/*.py, packaging/build.py) imported as a module, for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """ROOT / relative imported under `name` (default: the file's stem) and registered in sys.modules, where
    dataclasses and pickling look a module up."""
    name = name or Path(relative).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None, relative
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
