"""The pure pieces behind Ollama's API and the embeddings: options sorted into honoured / ignored / refused,
keep_alive durations, message translation (tool-call ids), the <think> splitter, OpenAI's embedding input
forms, and which models are embedding models with which pooling."""

from __future__ import annotations

import dataclasses

import pytest

from app.server.embeddings import as_inputs
from app.server.errors import APIError
from app.server.ollama import _Think
from app.server.ollama_requests import messages_of
from app.server.ollama_schemas import Message, OptionError, check_options, keep_alive_seconds
from backends.embeddings import is_embedding_model, kind, not_for_chat, pooling_type
from tests.fakes import fake_spec


def test_options_are_honoured_ignored_or_refused() -> None:
    opts, ignored = check_options({"temperature": 0.2, "num_ctx": 4096, "num_gpu": 99, "use_mmap": True, "seed": 3})
    assert (opts.temperature, opts.num_ctx, opts.seed) == (0.2, 4096, 3) and ignored == ["num_gpu", "use_mmap"]
    check_options({"mirostat": 0, "mirostat_tau": 5.0, "typical_p": 1.0, "repeat_last_n": 64, "tfs_z": 1.0})
    _, ignored = check_options({"num_experts": 2, "temperature": 0.5})  # unknown to Ollama too: ignored, as there
    assert ignored == ["num_experts"]
    for bad in ({"mirostat": 1}, {"typical_p": 0.9}, {"repeat_last_n": 128}):
        with pytest.raises(OptionError) as info:
            check_options(bad)
        assert next(iter(bad)) in info.value.args[0]
    with pytest.raises(ValueError):  # pydantic's: a string where a number belongs is not cast
        check_options({"top_k": "40"})


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, None), (0, 0.0), ("0", 0.0), (300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25),
     ("1.5s", 1.5), (-1, None), ("-1m", None), ("-1", None)],
)  # fmt: skip
def test_keep_alive_durations(value, seconds) -> None:
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "m", "5x", "5m3"])
def test_keep_alive_garbage_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        keep_alive_seconds(bad)


def test_ollama_messages_get_call_ids_and_results_answer_them_in_order() -> None:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    other = {"function": {"name": "get_time", "arguments": {}}}
    msgs = [
        Message(role="user", content="Weather and time?"),
        Message.model_validate({"role": "assistant", "content": "", "tool_calls": [call, other]}),
        Message(role="tool", content="12:00", tool_name="get_time"),
        Message(role="tool", content="sunny"),
    ]
    out = messages_of(msgs)
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert out[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert (out[2]["tool_call_id"], out[2]["name"]) == (ids[1], "get_time")  # named: that call
    assert (out[3]["tool_call_id"], out[3]["name"]) == (ids[0], "get_weather")  # unnamed: the first one left
    with pytest.raises(APIError, match="vision"):
        messages_of([Message(role="user", content="x", images=["AAAA"])])


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 100])
def test_think_splitter_whatever_the_pieces(cut) -> None:
    text = "  <think>step one</think>\n\nThe answer."
    splitter = _Think(True)
    thinking = content = ""
    for i in range(0, len(text), cut):
        t, c = splitter.feed(text[i : i + cut])
        thinking, content = thinking + t, content + c
    t, c = splitter.flush()
    assert (thinking + t, content + c) == ("step one", "The answer.")
    plain = _Think(True)
    assert plain.feed("<th")[1] == "" and plain.feed("ey said")[1] == "<they said"  # not a think block
    assert _Think(False).feed("<think>x</think>") == ("", "<think>x</think>")  # think not asked: as written


def test_openai_embedding_inputs() -> None:
    assert as_inputs("a", "input") == ["a"]
    assert as_inputs(["a", "b"], "input") == ["a", "b"]
    assert as_inputs([1, 2, 3], "input") == [[1, 2, 3]]
    assert as_inputs([[1], [2, 3]], "input") == [[1], [2, 3]]
    for bad in ([], [""], ["a", [1]], [[]], [True], ["x"] * 2049):
        with pytest.raises(APIError) as info:
            as_inputs(bad, "input")
        assert info.value.status == 400 and info.value.param == "input"


def test_embedding_models_and_their_pooling() -> None:
    chat = fake_spec()
    assert not is_embedding_model(chat) and pooling_type(chat) == "mean" and kind(chat) == "chat"
    bert = dataclasses.replace(fake_spec(), architecture="bert", metadata={"bert.pooling_type": 2})
    assert is_embedding_model(bert) and pooling_type(bert) == "cls" and kind(bert) == "embedding"
    qwen = dataclasses.replace(fake_spec(), architecture="qwen3", metadata={"qwen3.pooling_type": 3})
    assert is_embedding_model(qwen) and pooling_type(qwen) == "last"  # a decoder fine-tuned for embeddings
    none = dataclasses.replace(fake_spec(), metadata={"llama.pooling_type": 0})
    assert not is_embedding_model(none) and pooling_type(none) == "mean"
    encoder = dataclasses.replace(fake_spec(), metadata={"llama.attention.causal": False})
    assert is_embedding_model(encoder)
    assert "embedding model" in not_for_chat(bert) and "/v1/embeddings" in not_for_chat(bert)


def test_ollama_call_ids_given_by_the_client_are_kept() -> None:
    call = {"id": "call_abc", "function": {"name": "f", "arguments": {}}}
    msgs = [
        Message(role="user", content="go"),
        Message.model_validate({"role": "assistant", "content": "", "tool_calls": [call]}),
        Message(role="tool", content="done", tool_call_id="call_abc"),
    ]
    out = messages_of(msgs)
    assert out[1]["tool_calls"][0]["id"] == "call_abc" and out[2]["tool_call_id"] == "call_abc"
