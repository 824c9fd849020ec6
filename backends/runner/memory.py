"""What worked, remembered per machine and model, so the next start does not crash first.

One small JSON file (in hearth's cache dir) maps "machine | model" to the configuration that served a reply
after the plan's own crashed: {"backend": ..., "extra_bufts": ..., "n_gpu_layers": ..., "why": ..., "when": ...}.
The machine is its CPU (model and flags) and the versions of the engines' libraries, so a new
llama-cpp-python build (which may fix the crash) starts from the plan again.  The model is its path, size and
modification time.  A damaged file is treated as empty and rewritten.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from backends.atomic_write import write_text_atomically
from backends.modelspec import ModelSpec
from hwprobe.cpu import cpu_identity, has_amx

__all__ = ["ConfigMemory", "cpu_identity", "has_amx", "machine_key", "model_key"]

_LIBRARIES = ("llama-cpp-python", "torch")
_lock = threading.Lock()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine_key() -> str:
    model, flags = cpu_identity()
    text = "|".join([model, ",".join(sorted(flags)), *(f"{d}={_version(d)}" for d in _LIBRARIES)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_key(spec: ModelSpec) -> str:
    try:
        st = os.stat(spec.path)
        ident = f"{os.path.realpath(spec.path)}|{st.st_size}|{int(st.st_mtime)}"
    except OSError:
        ident = spec.path
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


class ConfigMemory:
    def __init__(self, path: str | os.PathLike[str], machine: str) -> None:
        self.path = Path(path)
        self.machine = machine

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def recall(self, spec: ModelSpec) -> dict[str, Any] | None:
        entry = self._read().get(f"{self.machine}|{model_key(spec)}")
        return entry if isinstance(entry, dict) else None

    def remember(self, spec: ModelSpec, changes: dict[str, Any], why: str) -> None:
        self._write(
            f"{self.machine}|{model_key(spec)}",
            {**changes, "why": why, "model": spec.path, "when": time.strftime("%Y-%m-%d %H:%M:%S")},
        )

    def record_check(self, check: str, passed: bool, detail: str) -> None:
        """The outcome of a machine-wide check (`hearth doctor`), e.g. "llama.cpp extra_bufts"."""
        self._write(
            f"{self.machine}|check:{check}",
            {"passed": passed, "detail": detail, "when": time.strftime("%Y-%m-%d %H:%M:%S")},
        )

    def check_passed(self, check: str) -> bool | None:
        entry = self._read().get(f"{self.machine}|check:{check}")
        return bool(entry.get("passed")) if isinstance(entry, dict) else None

    def _write(self, key: str, value: dict[str, Any]) -> None:
        with _lock:
            data = self._read()
            data[key] = value
            try:  # a unique temporary name: two hearth processes may remember at once
                write_text_atomically(self.path, json.dumps(data, indent=1))
            except OSError:
                pass  # remembering is an optimisation: a read-only cache costs one more crash next time

    def forget(self, spec: ModelSpec) -> None:
        with _lock:
            data = self._read()
            if data.pop(f"{self.machine}|{model_key(spec)}", None) is not None:
                try:
                    self.path.write_text(json.dumps(data, indent=1))
                except OSError:
                    pass
