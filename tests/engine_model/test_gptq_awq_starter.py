"""Issue 46 item 4 on a real model: the starter (SmolLM2-135M) packed as GPTQ and AWQ folders gives the perplexity
of the dense model of exactly the weights those folders stand for, within 0.5 %, on the torch engine.

The starter's GGUF is loaded by the engine in float32 (its Q4_1 blocks dequantized: real weights), written back
under Hugging Face names (tests/hf_export.py), and its seven projections per layer quantized round-to-nearest and
packed by tests/gptq_awq_factory.py into GPTQ (4-bit asymmetric, groups of 32: 576 and 1536 are multiples of it)
and AWQ GEMM (groups of 64).  The reference is a float32 folder of the dequantized values; both are scored by
app.perplexity.perplexity, the computation `hearth ppl` runs, over the engine's prompt logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quantize import QuantLinear
from backends.torch_engine.tokenizer import load_tokenizer
from tests.gptq_awq_factory import Variant, write_checkpoint, write_dense
from tests.hf_export import hf_config, hf_state

pytestmark = pytest.mark.slow
pytest.importorskip("safetensors")

ENGLISH = Path(__file__).resolve().parents[1] / "data" / "english.txt"
CTX = 256  # perplexity windows of 256 tokens, consecutive (stride = ctx)
# one thread (the runner sets torch's count for the whole process, the factory's packing included): on a busy
# 2-core machine two threads that wait for each other ran this test 4-7 times slower than one
OPTIONS = LoadOptions(n_ctx=CTX, max_num_seqs=1, dtype="float32", weight_quant="none", n_threads=1)


class _Logits:
    """ModelRunner.prompt_logits as the Backend.logits() that app.perplexity reads: (tokens, vocab) numpy."""

    def __init__(self, folder: Path) -> None:
        self.runner = ModelRunner(load_spec(folder), OPTIONS)

    def logits(self, ids):
        return self.runner.prompt_logits(ids).numpy()


@pytest.fixture(scope="module")
def starter_hf(starter_path, tmp_path_factory):
    """(the starter's weights under Hugging Face names, its config.json, its tokenizer, the text's token ids)."""
    runner = ModelRunner(load_spec(starter_path), OPTIONS)
    sd = {k: v.detach().float().clone() for k, v in hf_state(runner.model, "llama").items()}
    config = hf_config(runner.model.cfg, "llama", max_position_embeddings=CTX)
    tok = load_tokenizer(load_spec(starter_path))
    ids = tok.encode(ENGLISH.read_text(encoding="utf-8")[:2400])
    return sd, config, tok, ids


def _perplexity(folder: Path, ids: list[int]) -> tuple[float, ModelRunner]:
    from app.perplexity import perplexity

    scorer = _Logits(folder)
    res, _ = perplexity(scorer, ids, CTX, CTX)
    return res.perplexity, scorer.runner


@pytest.mark.parametrize(
    "variant, label",
    [(Variant(group_size=32), "GPTQ-4bit-g32"), (Variant(method="awq", group_size=64), "AWQ-4bit-g64")],
    ids=["gptq-asym-g32", "awq-g64"],
)
def test_starter_checkpoint_perplexity_is_its_dense_models(starter_hf, tmp_path: Path, variant, label) -> None:
    sd, config, tok, ids = starter_hf
    assert len(ids) >= 2 * CTX - 20, len(ids)
    folder, ref = write_checkpoint(tmp_path / "quant", sd, config, variant)
    dense = write_dense(tmp_path / "dense", ref, config)
    for f in (folder, dense):
        tok._tk.save(str(f / "tokenizer.json"))
    assert load_spec(folder).file_type == label
    ppl_dense, _ = _perplexity(dense, ids)
    ppl_quant, runner = _perplexity(folder, ids)
    layers = sum(isinstance(m, QuantLinear) for m in runner.model.modules())
    assert layers == 4 * config["num_hidden_layers"]  # qkv, o, gate_up, down: every projection stays packed
    gap = ppl_quant / ppl_dense - 1
    print(f"starter {label}: perplexity {ppl_quant:.4f}, its dense model {ppl_dense:.4f} ({100 * gap:+.4f} %)")
    assert abs(gap) < 0.005
    assert 5 < ppl_dense < 60  # a working model on English text (the starter scores ~17 on such a paragraph)
