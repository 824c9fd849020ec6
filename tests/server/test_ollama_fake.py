"""Ollama's API through the official `ollama` Python package, against a scripted FakeBackend on a live server:
the shapes (NDJSON streams and their final counters, tool calls as objects, errors as {"error": ...}), the
options that are honoured, ignored or refused, and what reaches the backend."""

from __future__ import annotations

import json

import httpx
import pytest

from app.server.background import BackgroundServer
from backends.api import Capabilities
from tests.fakes import FakeBackend, loaded_fake
from tests.runner_fakes import EmbeddingFake
from tests.tool_fixtures import CALL, WEATHER

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.server

ASK = [{"role": "user", "content": "Weather in Paris?"}]


class ConstrainedFake(FakeBackend):
    capabilities = Capabilities(constraints=True, logits=False)


class LogprobsFake(FakeBackend):
    capabilities = Capabilities(logprobs=True, logits=False)


@pytest.fixture
def serve():
    servers = []

    def start(backend, **config):
        servers.append(BackgroundServer(backend, "fake-model", **config))
        return servers[-1], ollama.Client(host=servers[-1].url, timeout=30)

    yield start
    for s in servers:
        s.stop()


def test_chat_whole_and_streamed_with_ollamas_counters(serve) -> None:
    backend = loaded_fake(replies=["Paris is the capital."])
    _, client = serve(backend)
    r = client.chat(model="fake-model", messages=[{"role": "user", "content": "Capital?"}], stream=False)
    assert r.message.role == "assistant" and r.message.content == "Paris is the capital."
    assert r.done and r.done_reason == "stop"
    assert r.eval_count == 4 and r.prompt_eval_count > 0 and r.total_duration > 0 and r.load_duration == 0
    assert r.eval_duration is not None and r.prompt_eval_duration is not None
    assert r.created_at.endswith("Z")
    # hearth's default system prompt where the client sent none (Ollama's Modelfile SYSTEM)
    assert "You are a helpful assistant." in backend.requests[-1].prompt

    parts = list(client.chat(model="fake-model", messages=[{"role": "user", "content": "Capital?"}], stream=True))
    assert "".join(p.message.content for p in parts) == "Paris is the capital."
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == 4 and parts[-1].done_reason == "stop"


def test_options_reach_the_sampler_and_unknown_ones_are_refused(serve) -> None:
    backend = loaded_fake(replies=["one two three four five six"])
    _, client = serve(backend)
    r = client.generate(
        model="fake-model:latest",  # Ollama's default tag names the same model
        prompt="Count",
        options={
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "seed": 7,
            "num_predict": 3,
            "stop": ["six"],
            "repeat_penalty": 1.2,
            "num_gpu": 99,  # a load option: ignored (hearth plans the load)
            "num_thread": 4,
        },
    )
    sp = backend.requests[-1].sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed, sp.max_tokens) == (0, 0.5, 3, 0.1, 7, 3)
    assert sp.stop[0] == "six" and sp.repeat_penalty == 1.2
    assert r.response == "one two three" and r.done_reason == "length"
    client.generate(model="fake-model", prompt="Count", raw=True)
    assert backend.requests[-1].prompt == "Count" and backend.requests[-1].add_special is False
    sp = backend.requests[-1].sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repeat_penalty) == (0.8, 0.9, 40, 0.0, 1.0)  # defaults

    for options, word in (
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"temperature": "hot"}, "temperature"),
    ):
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(model="fake-model", messages=ASK, options=options)
        assert info.value.status_code == 400 and word in info.value.error
    client.chat(model="fake-model", messages=ASK, options={"mirostat": 0, "typical_p": 1.0})  # "off": accepted
    # an option nobody knows is ignored, as Ollama's server ignores it
    client.chat(model="fake-model", messages=ASK, options={"bogus": 1, "temperature": 0.3})
    assert backend.requests[-1].sampling.temperature == 0.3


def test_fields_ollama_does_not_know_are_ignored_and_known_ones_checked(serve, caplog) -> None:
    """A client newer than hearth (or a UI that adds its own keys) keeps working, as with Ollama; the names of what
    was ignored are logged at debug; a known field of the wrong type or range is still a 400 naming it."""
    backend = EmbeddingFake()
    backend.load()
    server, client = serve(backend)
    with caplog.at_level("DEBUG", logger="hearth.server"):
        for path, body in (
            ("/api/chat", {"messages": [{"role": "user", "content": "Capital?", "mood": "curious"}], "bogus": 1}),
            ("/api/generate", {"prompt": "Capital?", "width": 512, "steps": 4}),
            ("/api/embed", {"input": "Paris", "future_field": True}),
        ):
            r = httpx.post(server.url + path, json={"model": "fake-model", "stream": False, **body}, timeout=30)
            assert r.status_code == 200, (path, r.text)
    said = " ".join(rec.getMessage() for rec in caplog.records)
    assert "bogus" in said and "width" in said and "future_field" in said
    for body, word in (
        ({"messages": ASK, "logprobs": "yes"}, "logprobs"),
        ({"messages": ASK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": ASK, "stream": "no"}, "stream"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ):
        r = httpx.post(server.url + "/api/chat", json={"model": "fake-model", **body}, timeout=30)
        assert r.status_code == 400 and word in r.json()["error"], r.text
    # logprobs asks the engine for them (top_logprobs: how many alternatives), top_logprobs alone does not
    backend = LogprobsFake(replies=["Paris."])
    backend.load()
    _, client = serve(backend)
    client.chat(model="fake-model", messages=ASK, logprobs=True, top_logprobs=2)
    assert backend.requests[-1].sampling.logprobs == 2
    client.generate(model="fake-model", prompt="Capital?", top_logprobs=2)
    assert backend.requests[-1].sampling.logprobs is None


def test_tool_calls_whole_streamed_and_the_result_round_trip(serve) -> None:
    backend = loaded_fake(replies=["Checking.\n" + CALL, CALL, "It is 22 C in Paris."])
    _, client = serve(backend)
    r = client.chat(model="fake-model", messages=ASK, tools=[WEATHER])
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.message.content == "Checking."
    assert "get_weather" in backend.requests[-1].prompt

    parts = list(client.chat(model="fake-model", messages=ASK, tools=[WEATHER], stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}]
    assert "<tool_call>" not in "".join(p.message.content for p in parts)

    history = ASK + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "22 C", "tool_name": "get_weather"},
    ]
    r = client.chat(model="fake-model", messages=history, tools=[WEATHER])
    assert r.message.content == "It is 22 C in Paris." and not r.message.tool_calls
    prompt = backend.requests[-1].prompt
    assert "<tool_response>\n22 C\n</tool_response>" in prompt and '"city": "Paris"' in prompt


def test_format_json_and_schema_are_constraints(serve) -> None:
    backend = ConstrainedFake(replies=['{"a":1}'])
    backend.load()
    _, client = serve(backend)
    client.chat(model="fake-model", messages=ASK, format="json")
    assert backend.requests[-1].constraint.kind == "json_object"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    client.chat(model="fake-model", messages=ASK, format=schema)
    c = backend.requests[-1].constraint
    assert c.kind == "json_schema" and json.loads(c.schema) == schema
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}  # no finite document
    for bad in ({"type": "object", "not": {}}, endless):  # refused at compile time, before a model sees it
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(model="fake-model", messages=ASK, format=bad)
        assert info.value.status_code == 400 and info.value.error.startswith("format:")


def test_models_endpoints(serve) -> None:
    _, client = serve(loaded_fake())
    (m,) = client.list().models
    assert m.model == "fake-model" and m.details.family == "llama" and m.details.format == "gguf"
    shown = client.show("fake-model")
    assert shown.capabilities == ["completion", "tools"] and shown.modelinfo["general.architecture"] == "llama"
    (running,) = client.ps().models
    assert running.model == "fake-model" and running.size == 123 * 2**20 and running.context_length == 2048
    with pytest.raises(ollama.ResponseError) as info:
        client.show("nope")
    assert info.value.status_code == 404


def test_errors_have_ollamas_shape(serve) -> None:
    server, client = serve(loaded_fake(), api_key="k3y")
    url = server.url
    r = httpx.post(url + "/api/chat", json={"model": "fake-model", "messages": ASK})
    assert r.status_code == 401 and set(r.json()) == {"error"}
    auth = {"Authorization": "Bearer k3y"}
    for body, status, word in (
        ({"model": "nope", "messages": ASK}, 404, "nope"),
        ({"model": "fake-model", "messages": ASK, "keep_alive": "soon"}, 400, "keep_alive"),
        ({"model": "fake-model", "messages": ASK, "think": True}, 400, "thinking"),
        ({"model": "fake-model", "messages": ASK, "options": "hot"}, 400, "options"),
        ({"model": "fake-model", "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, 400, "vision"),
    ):
        r = httpx.post(url + "/api/chat", json=body, headers=auth)
        assert r.status_code == status and set(r.json()) == {"error"} and word in r.json()["error"], r.text
    r = httpx.post(url + "/api/pull", json={"model": "someone/else"}, headers=auth)
    assert r.status_code == 400 and "hearth pull" in r.json()["error"]
    r = httpx.post(url + "/api/pull", json={"model": "fake-model", "stream": False}, headers=auth)
    assert r.json() == {"status": "success"}
    assert httpx.get(url + "/api/nothing", headers=auth).json()["error"].startswith("no such endpoint")
    assert httpx.get(url + "/v1/nothing", headers=auth).json()["error"]["code"] == "not_found"  # OpenAI's shape
    assert httpx.get(url + "/api/version", headers=auth).json()["version"]


def test_empty_chat_loads_and_keep_alive_is_accepted(serve) -> None:
    backend = loaded_fake()
    server, client = serve(backend)
    r = httpx.post(server.url + "/api/chat", json={"model": "fake-model", "messages": [], "keep_alive": "5m"})
    assert r.status_code == 200 and json.loads(r.text.splitlines()[-1])["done_reason"] == "load"
    assert backend.requests == []
    r = client.generate(model="fake-model", prompt="", keep_alive=0)
    assert r.done and backend.requests == []


class UnloadingFake(FakeBackend):
    """A backend that unloads as RunnerBackend does: the next use loads it again."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.unloads = 0

    def unload(self) -> bool:
        if not self.loaded:
            return False
        self.loaded = False
        self.unloads += 1
        return True

    @property
    def resident(self) -> bool:
        return self.loaded

    def stream(self, request):
        if not self.loaded:
            self.load()
        yield from super().stream(request)


def _wait_for(check, timeout_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_keep_alive_unloads_after_idle_and_the_next_request_loads(serve) -> None:
    backend = UnloadingFake(load_delay_s=0.2)
    backend.load()
    server, client = serve(backend)
    r = client.chat(model="fake-model", messages=ASK, keep_alive=0)  # unload once this request is done
    assert r.load_duration == 0
    assert _wait_for(lambda: backend.unloads == 1) and client.ps().models == []
    r = client.chat(model="fake-model", messages=ASK, keep_alive="1s")
    assert r.load_duration >= 0.2e9 and backend.loaded  # loaded again, and the reply says how long it took
    (running,) = client.ps().models
    assert running.expires_at is not None and running.expires_at.year > 2000
    assert _wait_for(lambda: backend.unloads == 2)
    client.generate(model="fake-model", prompt="")  # Ollama's preload: an empty request loads it
    assert backend.loaded
    client.generate(model="fake-model", prompt="", keep_alive=0)  # and with keep_alive 0 unloads it
    assert backend.unloads == 3 and not backend.loaded
    client.chat(model="fake-model", messages=ASK, keep_alive=-1)  # negative: forever
    assert client.ps().models[0].expires_at.year == 1  # Go's zero time: never


def test_the_servers_default_keep_alive_counts_openai_requests_too(serve) -> None:
    backend = UnloadingFake()
    backend.load()
    server, _ = serve(backend, keep_alive_s=0.3)
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "fake-model", "messages": ASK})
    assert r.status_code == 200
    assert _wait_for(lambda: backend.unloads == 1)
    assert httpx.get(server.url + "/health").status_code == 200 and not backend.loaded  # status paths load nothing


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_think_splits_reasoning_where_the_template_has_the_switch(serve) -> None:
    from tests.fakes import fake_spec

    backend = FakeBackend(
        spec=fake_spec(chat_template=THINKING_TEMPLATE), replies=["<think>Paris is in France.</think>\n\nParis."]
    )
    backend.load()
    _, client = serve(backend)
    assert "thinking" in client.show("fake-model").capabilities
    r = client.chat(model="fake-model", messages=ASK, think=True)
    assert r.message.thinking == "Paris is in France." and r.message.content == "Paris."
    parts = list(client.chat(model="fake-model", messages=ASK, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Paris is in France."
    assert "".join(p.message.content for p in parts) == "Paris."
    client.chat(model="fake-model", messages=ASK, think=False)
    assert backend.requests[-1].prompt.endswith("<think>\n\n</think>\n\n")  # the template's own switch, off
    r = client.chat(model="fake-model", messages=ASK)  # not asked: the reply as the model wrote it
    assert r.message.content.startswith("<think>") and not r.message.thinking
