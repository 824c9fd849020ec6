"""`hearth ppl --compare-formats` (app/ppl_formats.py): every format the planner may offer for a model, measured
against its best on the same windows and recorded for the plan's quality budget; and which formats those are."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hwprobe.candidates import quantized_formats
from hwprobe.plan_types import Prefs

ENGLISH = Path(__file__).resolve().parents[1] / "data" / "english.txt"


def test_the_formats_measured_are_the_planners_less_the_best() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hwprobe"))
    from hw_shapes import LLAMA3_8B, llama3_8b_q4_k_m, qwen25_7b_q8_0

    folder = dataclasses.replace(LLAMA3_8B, tokenizer="hf", extra={"file_format": "safetensors"})
    assert quantized_formats(folder, Prefs(backend="torch")) == ["W8A16", "FP8", "W4A16+attn8", "W4A16"]
    # a GGUF: never below its own bits (Q4_K_M's 4.9: the 8-bit formats; Q8_0's 8.5: none)
    assert quantized_formats(llama3_8b_q4_k_m().to_shape(), Prefs(backend="torch")) == ["W8A16", "FP8"]
    assert quantized_formats(qwen25_7b_q8_0().to_shape(), Prefs(backend="torch")) == []


def test_compare_formats_on_the_starter_measures_and_records_w8a16(tmp_path, capsys) -> None:
    from app.cli import main
    from app.measurements import quality_records_for

    f = tmp_path / "t.txt"
    f.write_text(ENGLISH.read_text(encoding="utf-8")[:600], encoding="utf-8")  # ~130 tokens: 3 windows of 64
    assert main(["ppl", str(f), "--compare-formats", "--ctx", "64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["base_format"] == "GGUF" and report["tokens"] > 100 and report["perplexity"] > 1
    (row,) = report["formats"]  # Q4_1's own blocks are the best; W8A16 is the one format at least its bits
    assert row["format"] == "W8A16" and abs(row["ppl_increase_pct"]) < 2 and row["kl_mean"] < 0.05
    assert "FP8" in report["skipped"]  # this machine has no GPU
    ((fmt, pct, source),) = quality_records_for(report["model"])
    assert (fmt, pct) == ("W8A16", row["ppl_increase_pct"]) and source.startswith("hearth ppl --compare-formats")


def test_ppl_without_a_file_says_what_to_give(capsys) -> None:
    from app.cli import main

    assert main(["ppl"]) == 2
    assert "needs a text FILE" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["W8A16"])
def test_a_forced_format_is_the_torch_engines_only(fmt: str, capsys) -> None:
    from app.loading import open_backend
    from app.settings import load_settings
    from hwprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="made by the torch engine while loading"):
        open_backend(load_settings(backend="llama.cpp", ctx=64), load=False, weight_format=fmt)
