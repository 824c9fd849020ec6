"""OpenAI's sampling surface through the official openai client, on both real backends (a tiny random-weight
GGUF, tests/gguf_factory.py, so it is quick): logprobs/top_logprobs on chat, logprobs + echo on completions
(values checked against a direct log-softmax of the backend's own logits), n = 3 (seed + i per choice,
streamed with an index per choice), logit_bias and penalties, and a 400 naming every field hearth does not
serve."""

from __future__ import annotations

import numpy as np
import pytest

from backends.api import LoadOptions, Request, SamplingParams
from backends.modelspec import load_spec
from tests.gguf_factory import write_tiny_llama

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"
TOL = 2e-3
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
PROMPT = "The quick brown fox jumps over the lazy dog while the sun sets"


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    """(openai client, backend, reference backend for logits()) for each backend, behind one live server."""
    from openai import OpenAI

    from app.server.background import BackgroundServer

    spec = load_spec(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))
    if request.param == "torch":
        from backends.torch_engine.backend import TorchBackend

        backend = ref = TorchBackend(
            spec, LoadOptions(n_ctx=256, n_batch=32, max_num_seqs=8, dtype="float32", device="cpu")
        )
        backend.load()
    else:
        from backends.llama_cpp.backend import LlamaCppBackend

        backend = LlamaCppBackend(spec, LoadOptions(n_ctx=256, n_batch=32, n_threads=2))  # as hearth serve loads it
        ref = LlamaCppBackend(spec, LoadOptions(n_ctx=256, n_batch=32, n_threads=2, logits_all=True))
        backend.load()
        ref.load()
    server = BackgroundServer(backend, MODEL)
    yield OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120), backend, ref
    server.stop()
    backend.close()
    if ref is not backend:
        ref.close()


def pytest_generate_tests(metafunc):
    if "served" in metafunc.fixturenames:
        metafunc.parametrize("served", ["torch", "llama.cpp"], indirect=True, scope="module")


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def test_chat_logprobs_and_top_logprobs(served) -> None:
    client, _, _ = served
    kw = dict(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert b"".join(bytes(e.bytes) for e in content) == r.choices[0].message.content.encode()
    for e in content:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].bytes == e.bytes and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    streamed = [
        e
        for ch in client.chat.completions.create(stream=True, **kw)
        for c in ch.choices
        if c.logprobs
        for e in c.logprobs.content
    ]
    assert [e.bytes for e in streamed] == [e.bytes for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=TOL)
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_completions_echo_with_logprobs_agrees_with_the_logits(served) -> None:
    client, backend, ref = served
    ids = backend.tokenize(PROMPT, add_special=False)
    r = client.completions.create(
        model=MODEL, prompt=ids, echo=True, logprobs=2, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    choice = r.choices[0]
    prompt_text = backend.detokenize(ids)
    assert choice.text.startswith(prompt_text) and len(choice.text) > len(prompt_text)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(ids) + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == sorted(lp.text_offset) and "".join(lp.tokens) == choice.text
    generated = backend.generate(
        Request(prompt_token_ids=ids, sampling=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    ).token_ids
    all_ids = list(ids) + list(generated)
    lsm = log_softmax(ref.logits(all_ids))
    for pos in range(1, len(all_ids)):
        assert lp.token_logprobs[pos] == pytest.approx(lsm[pos - 1, all_ids[pos]], abs=TOL), pos
        assert 2 <= len(lp.top_logprobs[pos]) <= 3  # the 2 best plus the chosen one
    no_echo = client.completions.create(
        model=MODEL, prompt=ids, logprobs=0, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    ).choices[0]
    assert no_echo.text == choice.text[len(prompt_text) :] and no_echo.logprobs.token_logprobs == pytest.approx(
        lp.token_logprobs[len(ids) :], abs=TOL
    )
    echo_only = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, max_tokens=2).choices[0]
    assert echo_only.text.startswith(PROMPT) and echo_only.logprobs is None


def test_n_choices_use_seed_plus_i_and_stream_with_an_index_each(served) -> None:
    client, backend, _ = served
    kw = dict(model=MODEL, messages=MESSAGES, temperature=1.0, max_tokens=5, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(n=3, seed=41, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1
    for i in range(3):  # choice i is the request alone with seed 41 + i
        assert client.chat.completions.create(seed=41 + i, **kw).choices[0].message.content == texts[i]
    assert r.usage.completion_tokens == 15
    parts: dict[int, str] = {0: "", 1: "", 2: ""}
    finished = set()
    for ch in client.chat.completions.create(n=3, seed=41, stream=True, **kw):
        for c in ch.choices:
            parts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2} and [parts[i] for i in range(3)] == texts
    if backend.capabilities.prefix_cache:  # the torch engine: choices 1.. take choice 0's prompt from the cache
        before = backend.stats().prefix_hit_tokens
        fresh = [{"role": "user", "content": "A prompt no other test sends, about rivers, lakes and mountains."}]
        client.chat.completions.create(model=MODEL, messages=fresh, n=3, max_tokens=2)
        assert backend.stats().prefix_hit_tokens - before >= 2 * 16  # at least one full block each
    completions = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=3, temperature=0)
    assert [c.index for c in completions.choices] == [0, 1]
    assert completions.choices[0].text == completions.choices[1].text  # greedy: both the same


def test_logit_bias_and_penalties_reach_the_backend(served) -> None:
    client, backend, _ = served
    forced = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=4,
        temperature=1.0,
        seed=1,
        logit_bias={"1234": 100},
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    assert forced.choices[0].logprobs.tokens == [backend.detokenize([1234])] * 4
    greedy = (
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .logprobs.tokens
    )
    first = backend.tokenize(greedy[0], add_special=False)[0]
    banned = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        logprobs=0,
        logit_bias={str(first): -100},
        extra_body={"ignore_eos": True},
    )
    assert banned.choices[0].logprobs.tokens[0] != greedy[0]
    ids = backend.tokenize(PROMPT)
    for kw in (dict(frequency_penalty=1.5), dict(presence_penalty=2.0)):
        served_text = (
            client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, **kw
            )
            .choices[0]
            .text
        )
        direct = backend.generate(
            Request(prompt_token_ids=ids, sampling=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **kw))
        ).text
        assert served_text == direct


@pytest.mark.parametrize(
    "endpoint,extra,param",
    [
        ("chat", {"best_of": 2}, "best_of"),
        ("chat", {"web_search_options": {}}, "web_search_options"),
        ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ("chat", {"temprature": 0.5}, "temprature"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"n": 17}, "n"),
        ("chat", {"logit_bias": {"abc": 1}}, "logit_bias"),
        ("chat", {"logit_bias": {"99999999": 1}}, "logit_bias"),
        ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
        ("completions", {"suffix": "end"}, "suffix"),
        ("completions", {"logprobs": True}, "logprobs"),  # an integer on completions
        ("completions", {"stream_options": {"include_usage": True, "chunk_size": 3}}, "stream_options.chunk_size"),
    ],
)
def test_a_field_hearth_does_not_serve_is_a_400_naming_it(served, endpoint, extra, param) -> None:
    import openai

    client, _, _ = served
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=extra)
        else:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=extra)
    assert info.value.body["param"] == param
    assert param.split(".")[-1] in info.value.body["message"] or param in ("n", "presence_penalty")


def test_null_fields_and_documented_extensions_are_accepted(served) -> None:
    client, _, _ = served
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        user="someone",
        extra_body={"top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1, "service_tier": None, "logit_bias": None},
    )
    assert r.choices[0].finish_reason in ("stop", "length")
