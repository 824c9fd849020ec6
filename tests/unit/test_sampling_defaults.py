"""A model's own sampling defaults (backends/sampling_defaults.py): the GGUF's general.sampling keys first, then a
folder's generation_config.json, then hearth's table of known models, else none; values out of range dropped."""

from __future__ import annotations

import dataclasses
import json

import pytest

from backends.hf_folder import spec_from_hf_folder
from backends.modelspec import load_spec
from backends.sampling_defaults import SamplingDefaults, sampling_defaults
from tests.fakes import fake_spec
from tests.hostile.test_hostile_hf import _folder


def _spec(name: str = "some-model", metadata: dict | None = None, path: str = "/models/x.gguf"):  # type: ignore[no-untyped-def]
    return dataclasses.replace(fake_spec(name=name, path=path), metadata=metadata or {})


def test_the_gguf_keys_come_first() -> None:
    spec = _spec(
        "SmolLM2 135M Instruct",  # in the table too: the file's own keys win
        {"general.sampling.temp": 0.7, "general.sampling.top_k": 30, "general.sampling.penalty_repeat": 1.05},
    )
    got = sampling_defaults(spec)
    assert got.values() == {"temperature": 0.7, "top_k": 30, "repeat_penalty": 1.05}
    assert got.source == "the GGUF's general.sampling keys"
    assert got.describe() == "temperature 0.7, top_k 30, repeat_penalty 1.05; from the GGUF's general.sampling keys"


def test_nonsense_values_are_dropped_not_clamped() -> None:
    spec = _spec(
        metadata={
            "general.sampling.temp": -1.0,
            "general.sampling.top_p": 2.0,
            "general.sampling.top_k": 2.5,
            "general.sampling.min_p": float("nan"),
            "general.sampling.penalty_repeat": True,
        }
    )
    assert sampling_defaults(spec) == SamplingDefaults()
    assert sampling_defaults(spec).describe() == "none: hearth's defaults apply"


def test_a_folders_generation_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = _folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "do_sample": True}))
    got = sampling_defaults(spec_from_hf_folder(folder))
    assert got.values() == {"temperature": 0.6, "top_p": 0.9}
    assert got.source == "the folder's generation_config.json"
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "do_sample": False}))
    assert sampling_defaults(spec_from_hf_folder(folder)).values() == {"temperature": 0.0}  # greedy
    (folder / "generation_config.json").write_text("[1, 2]")  # broken: one line naming the file, as config.json
    with pytest.raises(Exception, match="generation_config.json"):
        spec_from_hf_folder(folder)


@pytest.mark.parametrize(
    ("name", "path", "want"),
    [
        ("SmolLM2 135M Instruct", "/m/x.gguf", {"temperature": 0.2, "top_p": 0.9}),
        ("model", "/m/SmolLM2-360M-Instruct-Q8_0.gguf", {"temperature": 0.2, "top_p": 0.9}),  # by the file name
        ("Gemma 3 270m", "/m/x.gguf", {"temperature": 1.0, "top_k": 64, "top_p": 0.95}),
        ("Qwen3 8B", "/m/x.gguf", {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0}),
        ("Meta Llama 3.1 8B Instruct", "/m/x.gguf", {"temperature": 0.6, "top_p": 0.9}),
        ("Meta Llama 3.1 8B", "/m/x.gguf", {}),  # a base model: no recommendation
        ("Mistral 7B", "/m/x.gguf", {}),
    ],
)
def test_the_table_of_known_models(name: str, path: str, want: dict) -> None:
    got = sampling_defaults(_spec(name, path=path))
    assert got.values() == want
    assert got.source.startswith("hearth's table") if want else got.source == ""


def test_the_starter_recommends_its_cards_values(starter_path) -> None:  # type: ignore[no-untyped-def]
    got = sampling_defaults(load_spec(starter_path))
    assert got.values() == {"temperature": 0.2, "top_p": 0.9} and "SmolLM2" in got.source
