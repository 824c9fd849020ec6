"""Backend.describe() is a typed record (backends/describe.py) that still reads as the mapping it used to be,
and crosses the runner boundary intact."""

from __future__ import annotations

import socket

from backends.describe import Description
from backends.runner import protocol as p


def test_fields_and_mapping_agree() -> None:
    d = Description("torch", "smollm2", 2048, {"device": "cpu", "cuda_graph_sizes": (1, 2)})
    assert d.n_ctx == 2048 and d["n_ctx"] == 2048 and d.get("device") == "cpu" and d.get("nope") is None
    assert list(d) == ["backend", "model", "n_ctx", "device", "cuda_graph_sizes"]
    assert dict(d) == {
        "backend": "torch",
        "model": "smollm2",
        "n_ctx": 2048,
        "device": "cpu",
        "cuda_graph_sizes": (1, 2),
    }
    assert d.with_facts(runner_pid=7)["runner_pid"] == 7 and "runner_pid" not in d


def test_an_unknown_context_is_absent_not_none() -> None:
    d = Description("remote", "m", None, {"url": "http://h/v1"})
    assert "n_ctx" not in d and d.get("n_ctx") is None and list(d) == ["backend", "model", "url"]


def test_from_mapping_round_trip_and_through_the_runner_protocol() -> None:
    d = Description("llama.cpp", "m", 512, {"n_gpu_layers": 0, "notes": ["flash attention on"], "extra_bufts": False})
    assert Description.from_mapping(d.as_dict()) == d
    a, b = socket.socketpair()
    try:
        p.Channel(a, p.ToRunner).send(p.Loaded(512, dict(d)))
        got = p.Channel(b, p.FromRunner).recv()
    finally:
        a.close()
        b.close()
    assert isinstance(got, p.Loaded) and Description.from_mapping(got.describe) == d
