"""gguf's constants (tensor type ids and block sizes, file types) without importing the gguf package.

Why.  Every hearth command that reads a GGUF header needs three tables from gguf.constants, and importing it runs
the package's __init__, which imports numpy and yaml: 0.15-0.33 s of CPU here, in the app process, at every
`hearth run`, `plan` or `show`, and most of the hostile suite's 1 s budget for refusing a bad header once the
prestarted runner's share is counted.  gguf/constants.py itself imports only the standard library, so it is
loaded on its own from the installed package (~0.02 s): gguf stays the one source of the tables.  Should a gguf
release give constants.py other imports, loading it alone fails and the package import is used instead.

The module is a separate copy: its enums are not gguf.constants' classes, so compare by value or name only (the
engines that import gguf itself never mix the two).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

_NAME = "_hearth_gguf_constants"


@cache
def constants() -> ModuleType:
    """gguf/constants.py as a module (loaded once)."""
    spec = importlib.util.find_spec("gguf")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / "constants.py"
        loaded = importlib.util.spec_from_file_location(_NAME, path)
        if not path.is_file() or loaded is None or loaded.loader is None:
            continue
        module = importlib.util.module_from_spec(loaded)
        sys.modules[_NAME] = module  # as an import would (enum and dataclass machinery look a class's module up)
        try:
            loaded.loader.exec_module(module)
        except ImportError:  # constants.py imports more than the standard library now
            del sys.modules[_NAME]
            break
        return module
    import gguf.constants  # lazy: the fallback costs numpy and yaml (module docstring)

    return gguf.constants
