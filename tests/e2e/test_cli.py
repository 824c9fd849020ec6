"""The CLI as a person uses it: `hearth run`, stdin, the terminal chat, models, and every bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gguf_factory import write_tiny_llama

pytestmark = pytest.mark.e2e


def hearth(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HEARTH_THREADS": "2"},
    )


def assert_clean_error(p: subprocess.CompletedProcess, match: str) -> None:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("hearth: error: ") and match in lines[0], p.stderr
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("  hint: "))


def test_run_answers_paris(starter_path: Path) -> None:
    p = hearth("run", "--temperature", "0", "What is the capital of France?")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout


def test_run_verbose_prints_plan_and_stats_to_stderr(starter_path: Path) -> None:
    p = hearth("run", "-t", "0", "-n", "8", "--verbose", "Hi")
    assert p.returncode == 0 and "tok/s" in p.stderr and "llama.cpp" in p.stderr
    assert "tok/s" not in p.stdout


def test_seeded_runs_at_the_starters_own_sampling_answer_paris(starter_path: Path) -> None:
    """Issue 45 item 3: without sampling flags the starter samples at its card's temperature 0.2 and top-p 0.9
    (hearth's generic 0.8 gave Paris in 5 of seeds 1-10 on this Xeon, the card's values in 9).  Seeded runs are
    sampled, and a sampled token may differ between CPUs' kernels, so two of three seeds must say Paris."""
    answers = [hearth("run", "--seed", str(seed), "-n", "40", "What is the capital of France?") for seed in (2, 3, 4)]
    assert all(p.returncode == 0 for p in answers), [p.stderr for p in answers]
    assert sum("Paris" in p.stdout for p in answers) >= 2, [p.stdout for p in answers]
    verbose = hearth("run", "--seed", "2", "-n", "4", "--verbose", "Hi")
    assert "sampling defaults: temperature 0.2, top_p 0.9; from hearth's table: SmolLM2" in verbose.stderr


def test_run_reads_stdin_and_honours_stop(starter_path: Path) -> None:
    p = hearth("run", "-t", "0", "--stop", "Paris", "-", stdin="What is the capital of France?")
    assert p.returncode == 0 and "Paris" not in p.stdout and "capital" in p.stdout


def test_empty_stdin(starter_path: Path) -> None:
    assert_clean_error(hearth("run", "-", stdin="  \n"), "stdin was empty")


def test_interactive_chat_keeps_history(starter_path: Path) -> None:
    script = "What is the capital of France?\n/help\n/clear\n/nonsense\nThanks!\n/bye\n"
    p = hearth("run", "-t", "0", "-n", "24", stdin=script)
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout and "/clear" in p.stderr and "unknown command /nonsense" in p.stderr


def test_models_list_and_add(tmp_path: Path, starter_path: Path) -> None:
    f = write_tiny_llama(tmp_path / "tiny.gguf", weight_type="Q8_0")
    p = hearth("models", "add", str(f), "--name", "tiny")
    assert p.returncode == 0 and "registered tiny" in p.stdout
    p = hearth("models")
    assert p.returncode == 0
    assert "smollm2-135m-instruct" in p.stdout and "134.5M" in p.stdout and "Q4_1" in p.stdout
    assert "tiny" in p.stdout and "Q8_0" in p.stdout and "8192" in p.stdout
    import json

    rows = json.loads(hearth("models", "--json").stdout)
    assert {r["name"] for r in rows} == {"smollm2-135m-instruct", "tiny"}
    assert f.exists() and f.parent == tmp_path  # registered, not copied


def test_bad_model_inputs(tmp_path: Path, starter_path: Path) -> None:
    good = write_tiny_llama(tmp_path / "good.gguf")
    data = good.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    (tmp_path / "text.gguf").write_text("not a model")
    corrupt = bytearray(data)
    corrupt[16:24] = (10**12).to_bytes(8, "little")  # metadata count
    (tmp_path / "corrupt.gguf").write_bytes(bytes(corrupt))
    alien = write_tiny_llama(tmp_path / "alien.gguf", architecture="alienformer")
    assert_clean_error(hearth("run", "-m", str(tmp_path / "missing.gguf"), "hi"), "does not exist")
    assert_clean_error(hearth("run", "-m", str(tmp_path / "cut.gguf"), "hi"), "truncated")
    assert_clean_error(hearth("run", "-m", str(tmp_path / "text.gguf"), "hi"), "not a GGUF file")
    assert_clean_error(hearth("run", "-m", str(tmp_path / "corrupt.gguf"), "hi"), "corrupt")
    assert_clean_error(hearth("run", "-m", str(alien), "hi"), "alienformer")
    assert_clean_error(hearth("run", "-m", "no-such-model", "hi"), "no model named 'no-such-model'")
    assert_clean_error(hearth("models", "add", str(tmp_path / "text.gguf")), "not a GGUF file")


def test_hostile_template_is_refused(tmp_path: Path, starter_path: Path) -> None:
    evil = write_tiny_llama(tmp_path / "evil.gguf", chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    assert_clean_error(hearth("run", "-m", str(evil), "hi"), "Python internals")


def test_prompt_longer_than_context(starter_path: Path) -> None:
    assert_clean_error(hearth("run", "--ctx", "64", "word " * 200), "but the context is 64")


def test_bad_sampling_value(starter_path: Path) -> None:
    assert_clean_error(hearth("run", "--temperature", "-1", "hi"), "temperature must be >= 0")


def test_help_and_version_are_instant() -> None:
    import time

    t0 = time.perf_counter()
    p = hearth("--help")
    assert p.returncode == 0 and "run" in p.stdout and "models" in p.stdout
    assert hearth("--version").stdout.startswith("hearth ")
    assert time.perf_counter() - t0 < 20  # generous: a torch import alone would show in the hygiene test


def test_version_verbose_reports_gpu_offload() -> None:
    p = hearth("--version", "--verbose")
    assert p.returncode == 0 and "llama.cpp GPU offload:" in p.stdout
