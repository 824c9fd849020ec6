"""`hearth serve --ollama-port N` as a subprocess with the starter model on both backends, driven by the official
`ollama` Python package (chat, streaming chat, generate, list, show, embed, format with a schema, a tool round
trip) and the openai client's embeddings on the same server."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.server.background import free_port
from tests.serve_process import wait_healthy

ollama = pytest.importorskip("ollama")

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
HEARTH = str(Path(sys.executable).with_name("hearth"))
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def server(request, tmp_path_factory, starter_path):
    port, ollama_port = free_port(), free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp_path_factory.mktemp("home"))}
    log = tmp_path_factory.mktemp("log") / "serve.log"
    args = ["--ctx", "1024", "--backend", request.param, "--max-concurrency", "4"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [HEARTH, "serve", "--port", str(port), "--ollama-port", str(ollama_port), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_healthy(proc, f"http://127.0.0.1:{port}", 120, log)
    yield request.param, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ollama_port}"
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_chat_streaming_chat_and_generate(server) -> None:
    _, _, url = server
    client = ollama.Client(
        host=url, timeout=600
    )  # Ollama's own port: what clients find without settings; a shared 2-core machine can be slow
    whole = client.chat(model=MODEL, messages=QUESTION, options=GREEDY)
    assert "Paris" in whole.message.content
    assert whole.done and whole.eval_count >= 1 and whole.prompt_eval_count > 10 and whole.total_duration > 0
    parts = list(client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content  # greedy: the same reply
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count
    g = client.generate(model=MODEL, prompt="What is the capital of France?", options=GREEDY)
    assert "Paris" in g.response and g.done_reason in ("stop", "length")


def test_list_and_show_read_the_gguf_header(server) -> None:
    _, _, url = server
    client = ollama.Client(host=url, timeout=30)
    (m,) = [m for m in client.list().models if m.model == MODEL]
    assert m.size > 90_000_000 and m.details.family == "llama" and m.details.quantization_level == "Q4_1"
    shown = client.show(MODEL)
    assert shown.modelinfo["llama.context_length"] == 8192 and "completion" in shown.capabilities
    assert "<|im_start|>" in shown.template
    (running,) = client.ps().models
    assert running.context_length == 1024 and running.size > 0


def test_format_with_a_schema_gives_valid_json(server) -> None:
    _, _, url = server
    client = ollama.Client(host=url, timeout=600)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    r = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Where is the Eiffel tower? Answer in JSON."}],
        format=schema,
        options={"temperature": 0, "num_predict": 64},
    )
    data = json.loads(r.message.content)
    assert set(data) == {"city", "country"}


def test_a_tool_round_trip(server) -> None:
    """The starter does not decide to call tools by itself; the history of a call and its result is what a
    client sends back, and the model answers from it (the call shapes: tests/server/test_ollama_fake.py)."""
    _, _, url = server
    client = ollama.Client(host=url, timeout=600)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "Sunny, 22 degrees Celsius", "tool_name": "get_weather"},
    ]
    r = client.chat(model=MODEL, messages=history, tools=tools, options={"temperature": 0, "num_predict": 16})
    assert r.done and (r.message.content or r.message.tool_calls)


def test_embeddings_from_both_clients_agree(server) -> None:
    _, base, url = server
    from openai import OpenAI

    texts = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is the French capital."]
    e = ollama.Client(host=url, timeout=600).embed(model=MODEL, input=texts)
    vectors = np.array(e.embeddings)
    assert vectors.shape == (3, 576) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1]  # closer in meaning, closer in space
    assert e.prompt_eval_count > 10

    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    r = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens == e.prompt_eval_count
    assert np.allclose(np.array([d.embedding for d in r.data]), vectors, atol=1e-5)
    floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-5)
    ids = client.embeddings.create(model=MODEL, input=[[1, 504, 3575]])  # token-id input
    assert len(ids.data[0].embedding) == 576 and ids.usage.prompt_tokens == 3

    import openai

    # dimensions: the first d components, normalized again, on both APIs; more than the model has is a 400
    cut = client.embeddings.create(model=MODEL, input=texts[0], dimensions=64).data[0].embedding
    want = vectors[0][:64] / np.linalg.norm(vectors[0][:64])
    assert len(cut) == 64 and np.allclose(cut, want, atol=1e-5)
    short = ollama.Client(host=url, timeout=600).embed(model=MODEL, input=texts[0], dimensions=64)
    assert np.allclose(short.embeddings[0], want, atol=1e-5)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input="x", dimensions=577)
    assert info.value.body["param"] == "dimensions"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=url, timeout=600).embed(model=MODEL, input="x", dimensions=577)
    assert refused.value.status_code == 400 and "at most 576" in refused.value.error
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=[""])
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input="word " * 2000)  # over the 1024-token context
    assert info.value.body["code"] == "context_length_exceeded"
    # Ollama's default truncate: true cuts it to the context instead
    long = ollama.Client(host=url, timeout=600).embed(model=MODEL, input="word " * 2000)
    assert long.prompt_eval_count == 1024


def test_logprobs_in_the_clients_shape(server) -> None:
    """logprobs and top_logprobs from the official client, whole and streamed, on chat and generate: one entry a
    generated token, its text the reply's, the chosen token among its step's top ones (greedy: the first)."""
    _, _, url = server
    client = ollama.Client(host=url, timeout=600)
    whole = client.chat(model=MODEL, messages=QUESTION, options=GREEDY, logprobs=True, top_logprobs=3)
    # one entry a token of the reply (the end-of-turn token that stopped it counts in eval_count, has no text)
    assert whole.logprobs is not None and whole.eval_count - 1 <= len(whole.logprobs) <= whole.eval_count
    assert "".join(e.token for e in whole.logprobs).strip() == whole.message.content.strip()
    for entry in whole.logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the most likely token was chosen
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4
    parts = list(
        client.generate(
            model=MODEL, prompt="What is the capital of France?", options=GREEDY, stream=True, logprobs=True
        )
    )
    entries = [e for p in parts for e in (p.logprobs or [])]
    assert parts[-1].eval_count - 1 <= len(entries) <= parts[-1].eval_count
    assert all(not e.top_logprobs for e in entries)
    assert "".join(e.token for e in entries) == "".join(p.response for p in parts)
    plain = client.chat(model=MODEL, messages=QUESTION, options=GREEDY, top_logprobs=3)  # without logprobs: none
    assert not plain.logprobs


def test_base64_is_float32_little_endian(server) -> None:
    import httpx

    _, base, _ = server
    r = httpx.post(
        base + "/v1/embeddings", json={"model": MODEL, "input": "hello", "encoding_format": "base64"}, timeout=60
    ).json()
    vector = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (576,) and abs(np.linalg.norm(vector) - 1) < 1e-5
