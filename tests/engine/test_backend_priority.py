"""Priorities through the torch backend (fake runner, real engine thread): a chat at priority -1 that arrives
while background streams fill the batch preempts one of them, gets its reply first, and every stream's tokens
are still exactly its reference continuation."""

from __future__ import annotations

import threading
import time

from torch_engine_fakes import fake_build, fake_spec, reference_continuation

from backends.api import LoadOptions, Request, SamplingParams
from backends.torch_engine.backend import TorchBackend


def _request(rid: str, prompt: tuple[int, ...], n: int, priority: int) -> Request:
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return Request(prompt_token_ids=prompt, sampling=sp, request_id=rid, priority=priority)


def test_a_chat_preempts_background_streams_and_nobody_loses_a_token() -> None:
    options = LoadOptions(n_ctx=256, n_batch=64, max_num_seqs=2)
    b = TorchBackend(fake_spec(), options, build=fake_build(64, delay_s=0.004))
    b.load()
    try:
        done: dict[str, tuple[float, tuple[int, ...]]] = {}

        def run(r: Request) -> None:
            c = b.generate(r)
            done[r.request_id] = (time.perf_counter(), c.token_ids)

        prompts = {"bg1": tuple(range(1, 20)), "bg2": tuple(range(30, 45)), "chat": (7, 8, 9, 10)}
        background = [
            threading.Thread(target=run, args=(_request(rid, prompts[rid], 150, 0),)) for rid in ("bg1", "bg2")
        ]
        for t in background:
            t.start()
        while b.stats().generated_tokens < 20:  # both stream
            time.sleep(0.005)
        sent = time.perf_counter()
        run(_request("chat", prompts["chat"], 5, -1))
        for t in background:
            t.join(60)
        assert b.stats().preemptions >= 1  # the batch was full: one background stream made room
        assert done["chat"][0] < min(done["bg1"][0], done["bg2"][0])  # its reply came while they still ran
        assert done["chat"][0] - sent < 0.5 * (min(done["bg1"][0], done["bg2"][0]) - sent)
        for rid, p in prompts.items():
            n = 5 if rid == "chat" else 150
            assert list(done[rid][1]) == reference_continuation(p, n), rid
    finally:
        b.close()
