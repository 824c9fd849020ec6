"""The remote backend against hearth's own server (a FakeBackend behind it): streaming, usage, abort, the key,
errors mapped to hearth's, and the one request builder sending messages rather than a rendered prompt."""

from __future__ import annotations

import threading

import pytest

from app.requests import chat_request
from app.server.background import free_port
from backends.api import EventKind, FinishReason, Request, SamplingParams
from backends.errors import BackendUnavailableError, ContextOverflowError, InvalidRequestError
from backends.remote.backend import RemoteBackend
from backends.remote.spec import RemoteTarget, remote_spec
from hwprobe.errors import ConfigError
from tests.fakes import loaded_fake

REPLY = "The capital of France is Paris."


def remote(url: str, model: str | None = None, key: str | None = None) -> RemoteBackend:
    return RemoteBackend(remote_spec(model or "", url), None, RemoteTarget(url, model, key, "the test"))


def chat(backend: RemoteBackend, text: str = "What is the capital of France?", **sampling) -> Request:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    return chat_request(backend.spec, messages, SamplingParams(temperature=0, **sampling)).request


def test_streams_a_chat_with_usage_and_the_model_from_v1_models(served):
    fake = loaded_fake(replies=(REPLY,))
    server = served(fake, "served-model")
    backend = remote(server.url)
    backend.load()
    assert backend.spec.name == "served-model"  # no --remote-model: the first id /v1/models lists
    events = list(backend.stream(chat(backend, max_tokens=64, stop=("zzz",), seed=7)))
    assert [e.kind for e in events][0] is EventKind.STARTED and events[-1].kind is EventKind.FINISHED
    assert "".join(e.text for e in events if e.kind is EventKind.TOKEN) == REPLY
    done = events[-1]
    assert done.finish_reason is FinishReason.STOP
    assert done.stats.completion_tokens == len(REPLY.split())  # the fake's one token per word, from usage
    assert done.stats.prompt_tokens > 0 and done.stats.ttft_s > 0 and done.stats.total_s >= done.stats.ttft_s
    # the server got the messages (rendered there with its model's template) and the sampling asked for
    sent = fake.requests[-1]
    assert sent.messages is not None and [m.content for m in sent.messages] == [
        "be brief",
        "What is the capital of France?",
    ]
    assert "<|im_start|>user\nWhat is the capital" in sent.prompt
    assert sent.sampling.seed == 7 and sent.sampling.temperature == 0 and sent.sampling.stop[0] == "zzz"
    backend.close()


def test_length_and_raw_prompts(served):
    server = served(loaded_fake(replies=(REPLY,)))
    backend = remote(server.url, "fake-model")
    backend.load()
    done = backend.generate(chat(backend, max_tokens=2))
    assert done.finish_reason is FinishReason.LENGTH and done.stats.completion_tokens == 2
    raw = backend.generate(Request(prompt="Once upon", sampling=SamplingParams(max_tokens=3)))  # /v1/completions
    assert raw.text == "The capital of" and raw.finish_reason is FinishReason.LENGTH
    backend.close()


def test_abort_closes_the_stream_and_the_server_aborts_its_request(served):
    fake = loaded_fake(replies=(REPLY,))
    fake.hold = threading.Event()
    server = served(fake)
    backend = remote(server.url)
    backend.load()
    request = chat(backend)
    stream = backend.stream(request)
    assert next(stream).kind is EventKind.STARTED
    threading.Timer(0.2, backend.abort, (request.request_id,)).start()
    rest = list(stream)
    assert rest[-1].finish_reason is FinishReason.ABORT and rest[-1].error is None
    fake.hold.set()
    # the server saw the client go and freed the slot: the next request is answered
    assert backend.generate(chat(backend)).text == REPLY
    backend.close()


def test_the_right_key_is_accepted_and_a_wrong_one_is_a_config_error_naming_its_source(served):
    server = served(loaded_fake(), api_key="sesame")
    right = remote(server.url, key="sesame")
    right.load()
    assert right.generate(chat(right)).finish_reason is FinishReason.STOP
    right.close()
    for key in ("wrong", None):
        with pytest.raises(ConfigError) as info:
            remote(server.url, key=key).load()
        assert "refused the API key (401, key from the test)" in info.value.one_line()
        assert "HEARTH_REMOTE_API_KEY" in info.value.hint


def test_unreachable_url_is_one_line_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailableError) as info:
        remote(url).load()
    assert info.value.exit_code == 2
    assert f"cannot reach {url}/v1" in info.value.one_line() and "\n" not in info.value.one_line()


def test_an_unknown_model_and_a_prompt_over_the_context_are_hearth_errors(served):
    fake = loaded_fake()
    server = served(fake)
    with pytest.raises(ConfigError, match="does not serve 'no-such-model'; it serves fake-model"):
        remote(server.url, "no-such-model").load()
    backend = remote(server.url)
    backend.load()
    fake.fail_next = ContextOverflowError("prompt is 5000 tokens, the context holds 2048")
    with pytest.raises(ContextOverflowError, match="prompt is 5000 tokens, the context holds 2048"):
        list(backend.stream(chat(backend)))
    backend.close()


def test_a_mid_stream_failure_ends_with_error(served):
    fake = loaded_fake(replies=(REPLY,))
    server = served(fake)
    backend = remote(server.url)
    backend.load()
    fake.error_mid_stream = "the GPU fell off"
    done = backend.generate(chat(backend))
    assert done.finish_reason is FinishReason.ERROR and done.error
    backend.close()


@pytest.mark.parametrize(
    "status,body,error",
    [
        (403, {"error": {"message": "forbidden"}}, ConfigError),
        (400, {"error": {"message": "Requested tokens (3000) exceed context window of 2048"}}, ContextOverflowError),
        (400, {"detail": "This model's maximum context length is 2048 tokens"}, ContextOverflowError),
        (400, {"error": {"message": "temperature is bad"}}, InvalidRequestError),
        (404, {"error": {"message": "model 'x' not found"}}, ConfigError),
    ],
)
def test_http_errors_map_to_hearth_errors(status, body, error):
    import httpx

    from backends.remote.backend import _http_error

    exc = _http_error(httpx.Response(status, json=body), "http://h/v1", "/chat/completions", "the test")
    assert isinstance(exc, error) and str(status) in exc.one_line()


def test_a_5xx_ends_the_stream_with_error():
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})
        return httpx.Response(503, json={"error": {"message": "overloaded, try later"}})

    backend = RemoteBackend(remote_spec("", "http://h"), None, RemoteTarget("http://h"), httpx.MockTransport(answer))
    backend.load()
    assert backend.n_ctx == 4096 and backend.spec.context_length == 4096  # vLLM's max_model_len
    events = list(backend.stream(chat(backend)))
    assert [e.kind for e in events] == [EventKind.STARTED, EventKind.FINISHED]
    assert events[-1].finish_reason is FinishReason.ERROR
    assert events[-1].error == "the server at http://h/v1 failed (503): overloaded, try later"
