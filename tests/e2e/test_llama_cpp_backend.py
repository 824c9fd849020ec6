"""The llama.cpp backend on the real starter model: streaming, stop strings, abort, seeds, contract."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from backends.api import EventKind, FinishReason, LoadOptions, Request, SamplingParams
from backends.errors import ContextOverflowError, UnsupportedArchitectureError
from backends.modelspec import load_spec
from backends.templates import render_for_spec

pytestmark = pytest.mark.e2e

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def backend(starter_path: Path):
    from backends.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=1024, n_threads=2))
    b.load()
    yield b
    b.close()
    b.close()  # idempotent


def _request(backend, **sampling) -> Request:
    r = render_for_spec(backend.spec, QUESTION)
    return Request(prompt=r.text, add_special=r.add_special, sampling=SamplingParams(**sampling))


def test_greedy_answer_is_paris(backend) -> None:
    c = backend.generate(_request(backend, temperature=0, max_tokens=32))
    assert "Paris" in c.text and c.finish_reason is FinishReason.STOP
    assert c.stats.prompt_tokens > 20 and c.stats.completion_tokens >= 5 and c.stats.ttft_s > 0


def test_stream_order_and_several_chunks(backend) -> None:
    events = list(backend.stream(_request(backend, temperature=0, max_tokens=32)))
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.FINISHED
    assert kinds.count(EventKind.FINISHED) == 1 and set(kinds[1:-1]) == {EventKind.TOKEN}
    assert sum(1 for e in events if e.text) >= 4
    assert events[-1].stats.completion_tokens == sum(len(e.token_ids) for e in events) + 1  # + the EOS


def test_stop_string_ends_reply_and_is_not_shown(backend) -> None:
    c = backend.generate(_request(backend, temperature=0, max_tokens=32, stop=("Paris",)))
    assert c.finish_reason is FinishReason.STOP and "Paris" not in c.text
    assert c.text.startswith("The capital of France is")


def test_max_tokens_gives_length(backend) -> None:
    c = backend.generate(_request(backend, temperature=0, max_tokens=3))
    assert c.finish_reason is FinishReason.LENGTH and c.stats.completion_tokens == 3


def test_abort_mid_stream(backend) -> None:
    req = _request(backend, temperature=0.8, seed=1, max_tokens=400, ignore_eos=True)
    seen = 0
    last = None
    for event in backend.stream(req):
        if event.kind is EventKind.TOKEN:
            seen += 1
            if seen == 5:
                backend.abort(req.request_id)
        last = event
    assert last.finish_reason is FinishReason.ABORT and last.stats.completion_tokens < 10


def test_abort_from_another_thread(backend) -> None:
    req = _request(backend, temperature=0.8, seed=2, max_tokens=400, ignore_eos=True)
    timer = threading.Timer(0.3, backend.abort, args=(req.request_id,))
    timer.start()
    c = backend.generate(req)
    timer.join()
    assert c.finish_reason is FinishReason.ABORT and c.stats.completion_tokens < 400


def test_same_seed_same_reply(backend) -> None:
    a = backend.generate(_request(backend, temperature=1.0, seed=42, max_tokens=24))
    other = backend.generate(_request(backend, temperature=1.0, seed=7, max_tokens=24))
    b = backend.generate(_request(backend, temperature=1.0, seed=42, max_tokens=24))
    assert a.token_ids == b.token_ids and a.text == b.text
    assert other.token_ids != a.token_ids


def test_concurrent_streams_queue_and_all_finish(backend) -> None:
    results = {}

    def work(i: int) -> None:
        results[i] = backend.generate(_request(backend, temperature=0, max_tokens=8))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len({r.text for r in results.values()}) == 1 and len(results) == 3


def test_prompt_longer_than_context(backend) -> None:
    with pytest.raises(ContextOverflowError, match="tokens but the context is 1024"):
        backend.stream(Request(prompt="word " * 3000))


def test_tokenize_roundtrip_and_logits_need_logits_all(backend) -> None:
    ids = backend.tokenize("Hello world", add_special=False)
    assert backend.detokenize(ids) == "Hello world"
    with pytest.raises(Exception, match="logits_all"):
        backend.logits(ids)


def test_logits_match_between_calls(starter_path: Path) -> None:
    from backends.llama_cpp.backend import LlamaCppBackend

    b = LlamaCppBackend(load_spec(starter_path), LoadOptions(n_ctx=128, n_threads=2, logits_all=True))
    b.load()
    try:
        ids = b.tokenize("The quick brown fox jumps over the lazy dog")
        x, y = b.logits(ids), b.logits(ids)
        assert x.shape == (len(ids), 49152) and abs(x - y).max() < 1e-4
    finally:
        b.close()


def test_unknown_architecture_fails_fast(tmp_path: Path) -> None:
    from backends.llama_cpp.backend import LlamaCppBackend
    from tests.gguf_factory import write_tiny_llama

    p = write_tiny_llama(tmp_path / "alien.gguf", architecture="alienformer")
    with pytest.raises(UnsupportedArchitectureError, match="alienformer"):
        LlamaCppBackend(load_spec(p), LoadOptions(n_ctx=64)).load()
