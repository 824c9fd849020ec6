"""Every message of the runner protocol survives encode -> frame -> decode unchanged, in both directions."""

from __future__ import annotations

import socket
import typing

import pytest

from backends.api import (
    ChatMessage,
    EngineStats,
    EventKind,
    FinishReason,
    GenerationEvent,
    LoadOptions,
    Request,
    RequestStats,
    SamplingParams,
)
from backends.errors import ContextOverflowError, OutOfMemoryError, RunnerError
from backends.kernel_report import KernelReport, RecordedTable
from backends.runner import protocol as p
from tests.fakes import fake_spec

TO_RUNNER = [
    p.Load("llama.cpp", fake_spec(), LoadOptions(n_ctx=512, extra_bufts=False, tensor_split=(0.5, 0.5))),
    p.Stream(Request(prompt="hi", sampling=SamplingParams(temperature=0, stop=("\n",), seed=7))),
    p.Stream(Request(prompt_token_ids=(1, 2, 3), add_special=False)),
    p.Stream(
        Request(
            prompt="<s>hi", add_special=False, messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi"))
        )
    ),
    p.Abort("req-1"),
    p.Tokenize(1, "héllo", add_special=False),
    p.Detokenize(2, [1, 2]),
    p.Logits(3, [4, 5]),
    p.Embed(6, [[1, 2, 3], [4]]),
    p.Describe(4),
    p.Stats(5),
    p.KernelReportCall(6, "torch", fake_spec(), "/tmp/kernel_checks.json", check_now=True),
    p.Close(),
    p.Linger(300.0, "/run/user/1000/hearth/0123/torch-a-b.sock", "/tmp/runner.log", "smollm2-135m-instruct"),
    p.Linger(None, "/tmp/x.sock", "/tmp/runner.log", "m"),  # no limit: until `hearth stop`
]
FROM_RUNNER = [
    p.Heartbeat(123),
    p.Progress(0.5, "weights"),
    p.Loaded(2048, {"backend": "torch", "kv_blocks": 7}),
    p.LoadFailed(p.ErrorInfo("OutOfMemoryError", "needs 9 GiB", "try --ctx 2048")),
    p.Event(GenerationEvent(EventKind.STARTED, "r", stats=RequestStats(prompt_tokens=3, cached_tokens=2))),
    p.Event(GenerationEvent(EventKind.TOKEN, "r", text="é", token_ids=(5, 6))),
    p.Event(
        GenerationEvent(
            EventKind.FINISHED,
            "r",
            finish_reason=FinishReason.ERROR,
            stats=RequestStats(),
            error="boom",
            error_code="runner_crashed",
        )
    ),
    p.Events(
        [
            GenerationEvent(EventKind.TOKEN, "a", text="x", token_ids=(7,)),
            GenerationEvent(EventKind.TOKEN, "b", text="y", token_ids=(8,)),
        ]
    ),
    p.StreamFailed("r", p.ErrorInfo("ContextOverflowError", "too long")),
    p.TokensReply(1, [1, 2]),
    p.TextReply(2, "text"),
    p.ArrayReply(3, [2, 3], bytes(range(24)) * (1 << 12)),
    p.DescribeReply(4, {"a": 1}),
    p.StatsReply(5, EngineStats(running=1, kv_blocks=10, rss_bytes=1 << 30)),
    p.KernelReportReply(
        6, KernelReport(True, ("rope",), ("1 replaced", "  rope"), (RecordedTable({"device": "cpu"}, ("a", "b")),))
    ),
    p.CallFailed(6, p.ErrorInfo("X", "y")),
    p.Closed(),
    p.Lingering(),
    p.Resumed(4242, "/tmp/runner.log"),
]


def test_the_lists_cover_every_message_type():
    assert {type(m) for m in TO_RUNNER} == set(typing.get_args(p.ToRunner))
    assert {type(m) for m in FROM_RUNNER} == set(typing.get_args(p.FromRunner))


@pytest.mark.parametrize("messages,union", [(TO_RUNNER, p.ToRunner), (FROM_RUNNER, p.FromRunner)])
def test_round_trip(messages, union):
    a, b = socket.socketpair()
    sender, receiver = p.Channel(a, union), p.Channel(b, union)
    for message in messages:
        sender.send(message)
        got = receiver.recv()
        assert got == message and type(got) is type(message)
    a.close()
    assert receiver.recv() is None  # the peer's end: a clean None, not an exception


def test_a_broken_frame_is_a_protocol_error():
    a, b = socket.socketpair()
    a.sendall((5).to_bytes(8, "little") + b"\xc1xxxx")
    with pytest.raises(p.ProtocolError):
        p.Channel(b, p.ToRunner).recv()
    a.sendall((p.MAX_FRAME_BYTES + 1).to_bytes(8, "little"))
    with pytest.raises(p.ProtocolError, match="over the"):
        p.Channel(b, p.ToRunner).recv()


def test_errors_cross_with_their_type_message_and_hint():
    with pytest.raises(ContextOverflowError) as caught:
        p.raise_error(p.error_info(ContextOverflowError("prompt 9000 > 2048", "use --ctx 16384")))
    assert caught.value.hint == "use --ctx 16384"
    with pytest.raises(OutOfMemoryError):
        p.raise_error(p.error_info(OutOfMemoryError("out")))
    with pytest.raises(RunnerError, match="KeyError"):
        p.raise_error(p.error_info(KeyError("k")))
