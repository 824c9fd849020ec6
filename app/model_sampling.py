"""Each model's sampling defaults as hearth applies them, and the one rule every caller follows.

A model's defaults are the user's own for it (what they set in the chat app's settings, F3, kept per model in
DATA/model_sampling.json) over the model's recommendation (backends/sampling_defaults.py: its GGUF keys, its
generation_config.json, or hearth's table).  Every caller fills a sampling value the same way (`pick`): the value
the request or the user gave, else the model's default, else the caller's own default (hearth's for `hearth run`
and the chat app, OpenAI's and Ollama's on their APIs).

The file is small JSON ({model name: {"temperature": 0.5, "top_p": 0.9}}); a broken or oversized one is ignored
with a warning on the app's log rather than stopping a chat (it holds preferences, not conversations).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.paths import get_paths
from backends.atomic_write import write_text_atomically
from backends.sampling_defaults import SamplingDefaults, sampling_defaults
from backends.spec_types import ModelSpec

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty")
MAX_BYTES = 1 << 20
log = logging.getLogger(__name__)
_cache: dict[str, tuple[tuple[int, int], dict[str, dict[str, float]]]] = {}


def overrides_path() -> Path:
    return get_paths().data_dir / "model_sampling.json"


def _read_all() -> dict[str, dict[str, float]]:
    """Every model's overrides; {} when there is no file, or (warned) a broken one.  Read again only when the
    file changed (its mtime and size), so a server may ask per request."""
    path = overrides_path()
    try:
        st = path.stat()
    except OSError:
        return {}
    key = (st.st_mtime_ns, st.st_size)
    cached = _cache.get(str(path))
    if cached is not None and cached[0] == key:
        return cached[1]
    data: Any = {}
    try:
        if st.st_size > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s (%s): the models' own sampling defaults apply", path, exc)
        data = {}
    clean = {str(k): _valid(v) for k, v in data.items() if isinstance(v, dict)}
    _cache[str(path)] = (key, clean)
    return clean


def _valid(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if k in FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
    }


def user_overrides(name: str | None) -> dict[str, float]:
    """The user's own sampling values for the model registered as `name` ({} when none)."""
    return dict(_read_all().get(name, {})) if name else {}


def save_user_override(name: str, values: Mapping[str, float]) -> None:
    """Remember `values` as the user's defaults for `name` (merged over what was there)."""
    data = {k: dict(v) for k, v in _read_all().items()}
    data[name] = {**data.get(name, {}), **_valid(values)}
    path = overrides_path()
    os.makedirs(path.parent, exist_ok=True)
    write_text_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def model_defaults(spec: ModelSpec | None, name: str | None) -> SamplingDefaults:
    """The user's overrides for `name` over `spec`'s recommendation (either may be missing)."""
    recommended = sampling_defaults(spec) if spec is not None else SamplingDefaults()
    mine = user_overrides(name)
    if not mine:
        return recommended
    values = {**recommended.values(), **mine}
    if "top_k" in values:
        values["top_k"] = int(values["top_k"])
    source = f"your settings for {name} (the chat app's F3)"
    if recommended.source:
        source += f", over {recommended.source}"
    return SamplingDefaults(**values, source=source)  # type: ignore[arg-type]


def pick(
    given: Mapping[str, Any], defaults: SamplingDefaults, fallback: Mapping[str, float | int]
) -> dict[str, float | int]:
    """Each field of `fallback`: `given`'s value when not None, else the model's default, else `fallback`'s."""
    recommended = defaults.values()
    out: dict[str, float | int] = {}
    for field, default in fallback.items():
        value = given.get(field)
        out[field] = value if value is not None else recommended.get(field, default)
    return out
