"""hearth ppl on the starter model: matches an independent numpy computation; self-compare gives 0 / 0."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.loading import open_backend
from app.perplexity import perplexity
from app.settings import load_settings

ENGLISH = Path(__file__).resolve().parents[1] / "data" / "english.txt"
TEXT = ENGLISH.read_text(encoding="utf-8")[:700]  # about 145 tokens: several windows at ctx 64


class _CachedLogits:
    """The real backend with logits() memoised per token sequence: llama.cpp takes seconds per logits_all
    call on this machine, and the reference and the command's windows are the same sequences."""

    def __init__(self, backend):
        self.backend = backend
        self.cache = {}

    def tokenize(self, *a, **k):
        return self.backend.tokenize(*a, **k)

    def logits(self, ids):
        key = tuple(ids)
        if key not in self.cache:
            self.cache[key] = self.backend.logits(ids)
        return self.cache[key]


@pytest.fixture(scope="module")
def llama():
    loaded = open_backend(load_settings(backend="llama.cpp", ctx=64), logits_all=True)
    yield _CachedLogits(loaded.backend)
    loaded.backend.close()


def _reference_ppl(backend, ids, ctx):
    """Consecutive windows of ctx tokens (stride = ctx), each scoring all but its first token."""
    nll, n = 0.0, 0
    for start in range(0, len(ids), ctx):
        chunk = ids[start : start + ctx]
        if len(chunk) < 2:
            break
        x = backend.logits(chunk).astype(np.float64)  # (len(chunk), vocab)
        x = x - x.max(axis=1, keepdims=True)
        lsm = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
        nll -= sum(lsm[i - 1, chunk[i]] for i in range(1, len(chunk)))
        n += len(chunk) - 1
    return math.exp(nll / n), n


def test_ppl_matches_an_independent_log_softmax(llama):
    ids = llama.tokenize(TEXT, add_special=True, parse_special=False)
    assert len(ids) > 130
    res, _ = perplexity(llama, ids, 64, 64)
    ref, n = _reference_ppl(llama, ids, 64)
    assert res.tokens_scored == n
    assert res.perplexity == pytest.approx(ref, rel=1e-9)
    assert 1.0 < res.perplexity < 1000.0


def test_smaller_stride_scores_the_same_tokens_with_more_context(llama):
    ids = llama.tokenize(TEXT, add_special=True, parse_special=False)
    full, _ = perplexity(llama, ids, 64, 64)
    strided, _ = perplexity(llama, ids, 64, 32)
    n_windows = -(-len(ids) // 64)
    assert full.tokens_scored == len(ids) - n_windows  # each consecutive window skips its first token
    assert strided.tokens_scored == len(ids) - 1  # overlap: every token but the very first
    assert strided.perplexity != full.perplexity


def test_compare_with_itself_gives_zero_delta_and_zero_kl(llama):
    ids = llama.tokenize(TEXT, add_special=True, parse_special=False)
    base, other = perplexity(llama, ids, 64, 64, other=llama)
    assert other.perplexity - base.perplexity == pytest.approx(0.0, abs=1e-9)
    assert base.kl_mean == pytest.approx(0.0, abs=1e-9)


def test_ppl_command_json(tmp_path, capsys):
    from app.cli import main

    f = tmp_path / "t.txt"
    f.write_text(TEXT[:150], encoding="utf-8")  # about 30 tokens: two windows of 24 every 16
    assert (
        main(
            [
                "ppl",
                str(f),
                "--backend",
                "llama.cpp",
                "--ctx",
                "24",
                "--stride",
                "16",
                "--json",
                "--compare-backend",
                "llama.cpp",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ctx"] == 24 and out["stride"] == 16 and out["tokens_scored"] > 20
    assert out["compare"]["delta_ppl"] == pytest.approx(0.0, abs=1e-6)
    assert out["compare"]["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert out["compare"]["warning"] is None
    # the comparison is kept for the planner: the base model, in the compared run's format (its own Q4_1 here)
    from app.measurements import quality_records_for

    rec = out["compare"]["recorded"]
    assert rec["format"] == "Q4_1" and rec["ppl_increase_pct"] == pytest.approx(0.0, abs=1e-4)
    ((fmt, pct, source),) = quality_records_for(rec["model"])
    assert (fmt, pct) == ("Q4_1", rec["ppl_increase_pct"]) and source.startswith("hearth ppl --compare on")
    # and the plan names it as the quality figure it used
    assert main(["plan", "--json"]) == 0
    chosen = next(c for c in json.loads(capsys.readouterr().out)["candidates"] if c["chosen"])
    assert chosen["quant"] == "Q4_1" and chosen["quality_source"].startswith("measured: hearth ppl --compare on")


def test_ppl_command_refuses_a_missing_file(tmp_path, capsys):
    from app.cli import main

    assert main(["ppl", str(tmp_path / "missing.txt")]) == 2


def test_ppl_compare_with_a_gptq_folder_records_it_under_the_folders_own_name(tmp_path, capsys):
    """`hearth ppl --model ORIGINAL --compare GPTQ_FOLDER`: the GPTQ folder is a model of its own, whose plan
    reads the records under its name; the measured figure lands there too (and under the original's, as any
    compared format's) and replaces the folder's published default in its plan."""
    pytest.importorskip("safetensors")
    from app.cli import main
    from app.measurements import quality_records_for
    from tests.gptq_awq_factory import Variant, dense_weights, write_byte_tokenizer, write_dense, write_quantized

    gptq, _ = write_quantized(tmp_path / "tiny-gptq", Variant())
    original = write_dense(tmp_path / "tiny-f32", dense_weights(0))  # the weights the checkpoint was made from
    for folder in (gptq, original):
        write_byte_tokenizer(folder)
    assert main(["plan", str(gptq), "--json"]) == 0
    chosen = next(c for c in json.loads(capsys.readouterr().out)["candidates"] if c["chosen"])
    assert chosen["quant"] == "GPTQ-4bit-g32" and chosen["quality_source"].startswith("default:")
    f = tmp_path / "t.txt"
    f.write_text(TEXT[:300], encoding="utf-8")  # one token a byte: 300 tokens, 5 windows of 64
    argv = ["ppl", str(f), "--model", str(original), "--compare", str(gptq), "--backend", "torch", "--ctx", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "as GPTQ-4bit-g32" in out and "and as tiny-gptq's own format (its plan reads it)" in out, out
    assert main([*argv, "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["compare"]["recorded"]
    assert (rec["model"], rec["format"], rec["checkpoint"]) == ("tiny-f32", "GPTQ-4bit-g32", "tiny-gptq")
    for name in ("tiny-f32", "tiny-gptq"):
        ((fmt, pct, source),) = quality_records_for(name)
        assert (fmt, pct) == ("GPTQ-4bit-g32", rec["ppl_increase_pct"]) and source.startswith("hearth ppl --compare")
    assert main(["plan", str(gptq), "--json"]) == 0
    chosen = next(c for c in json.loads(capsys.readouterr().out)["candidates"] if c["chosen"])
    assert chosen["quality_source"].startswith("measured: hearth ppl --compare on")
    assert chosen["ppl_increase_pct"] == rec["ppl_increase_pct"]
