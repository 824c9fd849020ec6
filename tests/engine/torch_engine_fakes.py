"""Fakes for the torch engine's core tests: a "model" whose next token is a pure function of the whole context,
read back through the block tables from a fake paged KV cache.

`FakePagedKV` stores each token id in the slot its block table points to, and reads a request's context back
the same way.  If the block manager ever handed one block to two live prefixes, freed a block still in use, or
a prefix-cache hit pointed at the wrong block, the context read back differs from the request's real tokens and
the fake fails loudly; and the token it predicts would differ from `reference_continuation`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from backends.torch_engine.scheduler import Scheduler
from backends.torch_engine.seams import BLOCK_SIZE, RunnerOutput, SchedulerOutput

VOCAB = 97


def next_token(context: Sequence[int]) -> int:
    """The fake model: a deterministic token from the whole context (order and length matter)."""
    return zlib.crc32(",".join(map(str, context)).encode()) % VOCAB


def reference_continuation(prompt: Sequence[int], n: int, eos: frozenset[int] = frozenset()) -> list[int]:
    """What a request must produce with greedy decoding of the fake model: no batching, no cache."""
    ctx, out = list(prompt), []
    for _ in range(n):
        t = next_token(ctx)
        out.append(t)
        ctx.append(t)
        if t in eos:
            break
    return out


class FakePagedKV:
    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.host: dict[int, list[int | None]] = {}  # swap space: host slot -> one block's slots

    def _slot(self, block_table: Sequence[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size

    def run(self, out: SchedulerOutput, truth: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
        """Make the step's swap copies (out to `host`, then in), write every scheduled token, then read back the
        full context of each request that needs logits.  `truth` (request id -> its real tokens) makes the
        read-back checked."""
        bs = self.block_size
        for block, slot in out.swap_out:
            self.host[slot] = self.slots[block * bs : (block + 1) * bs]
        for slot, block in out.swap_in:
            self.slots[block * bs : (block + 1) * bs] = self.host.pop(slot)  # a slot is read back once
        for s in out.scheduled:
            assert len(s.block_table) * self.block_size >= s.end_position, "block table too short"
            for j, t in enumerate(s.token_ids):
                self.slots[self._slot(s.block_table, s.start_position + j)] = t
        contexts: dict[str, list[int]] = {}
        for s in out.scheduled:
            if s.needs_logits:
                ctx = [self.slots[self._slot(s.block_table, p)] for p in range(s.end_position)]
                assert None not in ctx
                if truth is not None:
                    assert ctx == truth[s.request_id][: s.end_position], f"{s.request_id}: KV read back wrong"
                contexts[s.request_id] = ctx  # type: ignore[assignment]
        return contexts


def fake_step(scheduler: Scheduler, kv: FakePagedKV) -> tuple[SchedulerOutput, dict[str, int]]:
    """One engine step without torch: schedule, run the fake model greedily, update."""
    out = scheduler.schedule()
    truth = {rid: list(r.token_ids) for rid, r in scheduler.requests.items()}
    contexts = kv.run(out, truth)
    sampled = {rid: next_token(ctx) for rid, ctx in contexts.items()}
    scheduler.update(out, sampled)
    return out, sampled


class FakeRunner:
    """A ModelRunner stand-in returning torch logits: a random-looking distribution per context (seeded by it)
    whose argmax is `next_token(context)`, so greedy output equals `reference_continuation`."""

    def __init__(self, num_blocks: int, vocab: int = VOCAB, delay_s: float = 0.0) -> None:
        self.kv = FakePagedKV(num_blocks)
        self.num_blocks = num_blocks
        self.vocab = vocab
        self.delay_s = delay_s
        self.steps: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        import time

        import torch

        self.steps.append(out)
        if self.delay_s:
            time.sleep(self.delay_s)
        contexts = self.kv.run(out)
        ids = tuple(s.request_id for s in out.scheduled if s.needs_logits)
        rows = []
        for rid in ids:
            ctx = contexts[rid]
            g = torch.Generator().manual_seed(zlib.crc32(repr(ctx).encode()))
            row = torch.rand(self.vocab, generator=g) * 4  # (vocab,) in [0, 4)
            row[next_token(ctx)] = 5.0
            rows.append(row)
        logits = torch.stack(rows) if rows else torch.empty(0, self.vocab)
        return RunnerOutput(ids, logits)


EOS = 0  # the fake model's end-of-sequence token


class FakeTokenizer:
    """Token i is the text "t{i} " (token 0, EOS, is a control token: no text).  encode() reads that back."""

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [int(w[1:]) for w in text.split()]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(f"t{i} " for i in token_ids)

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        return "".join(f"t{i} " for i in token_ids if i != EOS).encode()


def fake_spec(eos: tuple[int, ...] = (EOS,)):
    from backends.modelspec import ModelSpec

    return ModelSpec(
        path="/fake/model.gguf",
        format="gguf",
        name="fake",
        architecture="llama",
        n_layers=1,
        hidden_size=8,
        n_heads=1,
        n_kv_heads=1,
        head_dim=8,
        ffn_size=8,
        vocab_size=VOCAB,
        context_length=4096,
        rope_base=1e4,
        rope_scaling={},
        rms_eps=1e-5,
        n_experts=0,
        n_experts_used=0,
        sliding_window=0,
        file_type="F32",
        file_size_bytes=0,
        param_count=0,
        tensor_types={},
        tensors=(),
        tied_embeddings=True,
        chat_template=None,
        bos_token_id=None,
        eos_token_ids=eos,
        pad_token_id=None,
        add_bos_token=False,
        add_eos_token=False,
        tokenizer_model="fake",
        tokenizer_pre="",
    )


def fake_build(num_blocks: int = 64, delay_s: float = 0.0):
    """A `build` for TorchBackend: FakeRunner + FakeTokenizer."""
    from backends.torch_engine.backend import EngineParts

    def build(spec, options, progress):
        runner = FakeRunner(num_blocks, delay_s=delay_s)
        return EngineParts(
            runner=runner, tokenizer=FakeTokenizer(), num_blocks=num_blocks, describe=lambda: {"device": "fake"}
        )

    return build


# -- failures injected into a real or fake TorchBackend (one request's failure is that request's alone) ------
class InjectedFailure(RuntimeError):
    pass


FAILURES = {  # request id -> the error its stream must end with
    "bad-prepare": "the request failed: InjectedFailure: cannot prepare bad-prepare",
    "bad-sample-greedy": "sampling failed: InjectedFailure: cannot sample",
    "bad-sample-seeded": "sampling failed: InjectedFailure: cannot sample",
    "bad-stop": "the engine's update failed: InjectedFailure: cannot check for a stop",
    "bad-detok": "detokenizing failed: InjectedFailure: cannot detokenize",
}


def bad_sampling(request_id: str, max_tokens: int):
    """The SamplingParams each injected failure runs with (seeded ones draw, so a restore bug would show)."""
    from backends.api import SamplingParams

    if "seeded" in request_id or "prepare" in request_id:
        return SamplingParams(
            temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=len(request_id), max_tokens=max_tokens, ignore_eos=True
        )
    stop = ("BOOM",) if "detok" in request_id else ()
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, stop=stop)


def inject_failures(backend, monkeypatch) -> None:
    """Make the requests named in FAILURES fail where their id says (preparing, sampling after every row has
    drawn, the stop check of their 3rd token, detokenizing); every other request is untouched."""
    from backends.torch_engine import stream_events as backend_module  # where streams detokenize

    engine = backend._engine
    sampler, scheduler = engine.sampler, engine.scheduler
    prepare, sample_rows, stop_status = sampler.prepare, sampler._sample_rows, scheduler._stop_status

    def bad_prepare(request_id, params):
        if request_id.startswith("bad-prepare"):
            raise InjectedFailure(f"cannot prepare {request_id}")
        return prepare(request_id, params)

    def bad_sample_rows(logits, request_ids, params, histories, *rest):
        tokens = sample_rows(logits, request_ids, params, histories, *rest)  # every row has drawn from its generator
        if any(r.startswith("bad-sample") for r in request_ids):
            raise InjectedFailure("cannot sample")
        return tokens

    def bad_stop(request, token):
        if request.request_id.startswith("bad-stop") and request.num_output_tokens == 3:
            raise InjectedFailure("cannot check for a stop")
        return stop_status(request, token)

    class BadTextStream(backend_module.TextStream):
        def push(self, token_ids):
            if "BOOM" in self._stop:
                raise InjectedFailure("cannot detokenize")
            return super().push(token_ids)

    monkeypatch.setattr(sampler, "prepare", bad_prepare)
    monkeypatch.setattr(sampler, "_sample_rows", bad_sample_rows)
    monkeypatch.setattr(scheduler, "_stop_status", bad_stop)
    monkeypatch.setattr(backend_module, "TextStream", BadTextStream)
