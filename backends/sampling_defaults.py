"""A model's own sampling defaults: what its makers recommend, used wherever a request or the user sets no value.

Where they come from, the first that has any (`SamplingDefaults.source` says which):
1. the GGUF's `general.sampling.*` keys (llama.cpp's converter writes them from the model's
   generation_config.json: `temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`);
2. a Hugging Face folder's generation_config.json (`temperature`, `top_k`, `top_p`, `min_p`,
   `repetition_penalty`; `do_sample: false` means greedy), read into the spec's metadata by backends/hf_folder.py;
3. a small table of models hearth knows, each row citing its model card or generation_config.json (KNOWN);
4. nothing: the caller's defaults (hearth's for `hearth run` and the chat app, OpenAI's and Ollama's on their APIs).

A value out of SamplingParams' range (a temperature of -1, a top_p of 2) is dropped, not clamped: a file that says
nonsense recommends nothing.  Why per model: SmolLM2-135M answers "What is the capital of France?" with French
nonsense at hearth's generic 0.8 and with Paris at its card's 0.2 (issue 45).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from backends.spec_types import ModelSpec

GGUF_KEYS = {  # general.sampling.<key> -> SamplingDefaults field
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_repeat": "repeat_penalty",
}
HF_KEYS = {  # generation_config.json key -> SamplingDefaults field
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
}


@dataclass(frozen=True)
class SamplingDefaults:
    """The recommended values (None: no recommendation) and where they came from ("" when none)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    source: str = ""

    def values(self) -> dict[str, float | int]:
        """The fields that have a value, by SamplingParams' names."""
        return {f.name: v for f in fields(self) if f.name != "source" and (v := getattr(self, f.name)) is not None}

    def describe(self) -> str:
        """'temperature 0.2, top_p 0.9 (SmolLM2's model card)', or 'none (...)' when empty."""
        if not self.values():
            return "none: hearth's defaults apply"
        shown = ", ".join(f"{k} {v:g}" for k, v in self.values().items())
        return f"{shown}; from {self.source}"


@dataclass(frozen=True)
class Known:
    """A row of KNOWN: models whose name matches `pattern` (case-insensitive, on general.name or the file name)."""

    pattern: str
    values: dict[str, float | int]
    source: str


KNOWN: tuple[Known, ...] = (
    Known(
        r"smollm2",
        {"temperature": 0.2, "top_p": 0.9},
        "hearth's table: SmolLM2's model card (HuggingFaceTB/SmolLM2-135M-Instruct)",
    ),
    Known(
        r"gemma[-_ ]?3",
        {"temperature": 1.0, "top_k": 64, "top_p": 0.95},
        "hearth's table: Gemma 3's generation_config.json (google/gemma-3-*-it) and Ollama's gemma3 Modelfile",
    ),
    Known(
        r"qwen3",
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0},
        "hearth's table: Qwen3's model card (its thinking mode's values)",
    ),
    Known(
        r"llama[-_ ]?3.*instruct",
        {"temperature": 0.6, "top_p": 0.9},
        "hearth's table: Llama 3 Instruct's generation_config.json",
    ),
)


def _valid(name: str, value: Any) -> float | int | None:
    """`value` if it is a number in SamplingParams' range for `name`, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if name == "top_k":
        return int(value) if value >= 0 and value == int(value) else None
    ok = {
        "temperature": 0 <= value <= 100,
        "top_p": 0 < value <= 1,
        "min_p": 0 <= value <= 1,
        "repeat_penalty": 0 < value <= 10,
    }[name]
    return float(value) if ok else None


def _from(raw: dict[str, Any], keys: dict[str, str]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for key, name in keys.items():
        value = _valid(name, raw.get(key))
        if value is not None:
            out[name] = value
    return out


def _gguf_values(spec: ModelSpec) -> dict[str, float | int]:
    prefix = "general.sampling."
    return _from({k[len(prefix) :]: v for k, v in spec.metadata.items() if k.startswith(prefix)}, GGUF_KEYS)


def _hf_values(spec: ModelSpec) -> dict[str, float | int]:
    config = spec.metadata.get("generation_config")
    if not isinstance(config, dict):
        return {}
    out = _from(config, HF_KEYS)
    if config.get("do_sample") is False:  # transformers: greedy, whatever else the file says
        out["temperature"] = 0.0
    return out


def _known(spec: ModelSpec) -> Known | None:
    names = f"{spec.name} {spec.path.replace(chr(92), '/').rsplit('/', 1)[-1]}".lower()
    return next((row for row in KNOWN if re.search(row.pattern, names)), None)


def sampling_defaults(spec: ModelSpec) -> SamplingDefaults:
    """The model's recommended sampling (the module docstring's order)."""
    values = _gguf_values(spec)
    if values:
        return SamplingDefaults(**values, source="the GGUF's general.sampling keys")  # type: ignore[arg-type]
    values = _hf_values(spec)
    if values:
        return SamplingDefaults(**values, source="the folder's generation_config.json")  # type: ignore[arg-type]
    row = _known(spec)
    if row is not None:
        return SamplingDefaults(**row.values, source=row.source)  # type: ignore[arg-type]
    return SamplingDefaults()
