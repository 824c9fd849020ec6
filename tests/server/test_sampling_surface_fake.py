"""The sampling surface's HTTP rules that need no model: a backend without log-probabilities refuses them
with a 400 (never an answer without them), n choices each reach the backend with seed + i, and the remote
backend forwards OpenAI's penalties and logit_bias instead of dropping them."""

from __future__ import annotations

import httpx
import pytest

from backends.api import Request, SamplingParams
from tests.fakes import FakeBackend, fake_spec
from tests.fakes import loaded_fake as fake

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def body(**kw) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_logprobs_on_a_backend_without_them_is_a_400(live) -> None:
    s = live(fake())
    with httpx.Client(base_url=s.url) as c:
        r = c.post(CHAT, json=body(logprobs=True))
        assert r.status_code == 400 and "log-probabilities" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "echo": True, "logprobs": 1})
        assert r.status_code == 400
        assert c.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "echo": True}).status_code == 200


def test_n_choices_reach_the_backend_with_seed_plus_i(live) -> None:
    backend = fake()
    s = live(backend)
    with httpx.Client(base_url=s.url) as c:
        r = c.post(CHAT, json=body(n=3, seed=2**64 - 2, presence_penalty=0.5, logit_bias={"7": -100}))
    assert r.status_code == 200 and [ch["index"] for ch in r.json()["choices"]] == [0, 1, 2]
    seen = sorted(backend.requests, key=lambda q: q.request_id)
    assert [q.sampling.seed for q in seen] == [2**64 - 2, 2**64 - 1, 0]  # wrapped into 64 bits
    assert all(q.sampling.presence_penalty == 0.5 and q.sampling.logit_bias == ((7, -100.0),) for q in seen)
    assert len({q.request_id for q in seen}) == 3


def test_the_remote_backend_forwards_penalties_and_logit_bias() -> None:
    from backends.remote.backend import _body

    _, sent = _body(
        "m",
        Request(prompt="x", sampling=SamplingParams(presence_penalty=0.5, frequency_penalty=-1, logit_bias={12: -100})),
    )
    assert sent["presence_penalty"] == 0.5 and sent["frequency_penalty"] == -1
    assert sent["logit_bias"] == {"12": -100}
    _, plain = _body("m", Request(prompt="x"))
    assert not {"presence_penalty", "frequency_penalty", "logit_bias"} & plain.keys()


def test_logprobs_cross_the_runner_boundary_unchanged() -> None:
    """Events reach the server from the runner process as msgpack (backends/runner/protocol.py)."""
    import msgspec

    from backends.api import EventKind, GenerationEvent, TokenLogprob
    from backends.runner.protocol import Event, FromRunner

    entry = TokenLogprob(5, -0.25, ((5, -0.25), (9, -1.5)), b"\xe2\x80", (b"\xe2\x80", b" x"))
    event = GenerationEvent(
        EventKind.STARTED, "r", prompt_logprobs=(TokenLogprob(1, None, (), b"A"), entry), logprobs=(entry,)
    )
    back = msgspec.msgpack.Decoder(FromRunner).decode(msgspec.msgpack.Encoder().encode(Event(event)))
    assert back.event == event


def test_the_models_own_defaults_fill_what_a_request_leaves_out(live) -> None:
    """Issue 45 item 3 on both APIs: a model with recommended sampling (here SmolLM2's, by name) gets it wherever
    a request sets no value; a request's own values always win; a model without any gets the API's defaults."""
    backend = FakeBackend(spec=fake_spec(name="SmolLM2 135M Instruct"))
    backend.load()
    s = live(backend, model_name="smol")
    with httpx.Client(base_url=s.url, timeout=30) as c:
        ask = [{"role": "user", "content": "hi"}]
        assert c.post(CHAT, json={"model": "smol", "messages": ask}).status_code == 200
        sp = backend.requests[-1].sampling
        assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (0.2, 0.9, 0, 0.0)  # the card's, else OpenAI's
        c.post(CHAT, json={"model": "smol", "messages": ask, "temperature": 0.7, "top_k": 5})
        sp = backend.requests[-1].sampling
        assert (sp.temperature, sp.top_p, sp.top_k) == (0.7, 0.9, 5)
        assert c.post("/api/chat", json={"model": "smol", "messages": ask, "stream": False}).status_code == 200
        sp = backend.requests[-1].sampling
        assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (0.2, 0.9, 40, 0.0)  # the card's, else Ollama's
        c.post("/api/chat", json={"model": "smol", "messages": ask, "stream": False, "options": {"top_p": 0.5}})
        assert (backend.requests[-1].sampling.temperature, backend.requests[-1].sampling.top_p) == (0.2, 0.5)
    plain = fake()  # "fake-model": nothing recommended
    s = live(plain)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        c.post(CHAT, json=body())
        assert (plain.requests[-1].sampling.temperature, plain.requests[-1].sampling.top_p) == (1.0, 1.0)
