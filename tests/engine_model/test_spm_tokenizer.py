"""SentencePiece "llama" GGUF vocabularies (Llama 1/2, Mistral): ids equal llama.cpp's on a varied corpus, on a
vocabulary trained by the test (tests/gguf_factory.spm_vocab: byte fallback, control and user-defined tokens),
and a tiny random-weight model with it gives llama.cpp's logits through the torch engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.spm_tokenizer import SpmTokenizer
from backends.torch_engine.tokenizer import load_tokenizer
from tests.gguf_factory import write_tiny_llama

TEXT = (Path(__file__).parent.parent / "data" / "english.txt").read_text()
CORPUS = [
    "Hello world",
    "",
    " ",
    "\n",
    "  two  spaces",
    "\t\ttabs\n\n",
    "def f(x):\n    return x**2  # 12345\n\n",
    "naïve café — 東京 🙂 Ωμέγα مرحبا",
    "<s>hi</s> there<|user|>you",
    "<|user|>",
    "a<|user|>b",
    "The the THE tHe theee",
    "x" * 50,
    "3.14159 and 1,000,000!!!",
    TEXT[:3000],
]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from backends.llama_cpp.backend import open_llama

    path = write_tiny_llama(
        tmp_path_factory.mktemp("spm") / "spm.gguf", tokenizer="spm", n_heads=6, n_kv_heads=2, hidden=96
    )
    vocab = open_llama(str(path), vocab_only=True, verbose=False)
    yield path, load_tokenizer(load_spec(path)), vocab
    vocab.close()


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_ids_and_bytes_equal_llama_cpp(spm, index: int) -> None:
    _, tok, vocab = spm
    assert isinstance(tok, SpmTokenizer)
    text = CORPUS[index]
    for special in (True, False):
        assert tok.encode(text, parse_special=special) == vocab.tokenize(
            text.encode(), add_bos=True, special=special
        ), special
    ids = tok.encode(text)
    assert tok.token_bytes(ids) == vocab.detokenize(ids)


def test_byte_fallback_control_tokens_and_decode(spm) -> None:
    _, tok, _ = spm
    ids = tok.encode("東", add_special=False)
    assert [tok.tokens[i] for i in ids][-3:] == ["<0xE6>", "<0x9D>", "<0xB1>"]  # 東 is not in the vocabulary
    assert tok.encode("<s>", add_special=False) == [1]
    assert 1 not in tok.encode("<s>", add_special=False, parse_special=False)
    assert tok.decode(tok.encode("<s>hi 東")) == "<s><s> hi 東"  # BOS, <s>, then the text with its space prefix
    assert tok.token_bytes([1, 2]) == b""  # control tokens never show in a reply


def test_tiny_spm_model_gives_llama_cpp_logits(spm) -> None:
    from backends.llama_cpp.backend import open_llama

    path, tok, _ = spm
    ids = tok.encode(TEXT[:300])
    llm = open_llama(str(path), logits_all=True, n_ctx=256, n_threads=2, verbose=False)
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)])
    llm.close()
    runner = ModelRunner(load_spec(path), LoadOptions(n_ctx=256, max_num_seqs=1, dtype="float32"))
    ours = runner.prompt_logits(ids).numpy()
    assert np.abs(ours - ref).max() < 1e-3 * max(1.0, np.abs(ref).max())
