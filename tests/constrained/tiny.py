"""A tiny JSON-capable vocabulary and a fake model over it, for constrained-decoding tests without a real model.

`TinyTokenizer` has the Tokenizer protocol of backends/torch_engine/parts.py (token 0 is the control token
<eos>); `TinyRunner` returns, for every context, a pseudo-random logit row seeded by the context, so what a
request produces depends on its own tokens only (as with tests/engine/torch_engine_fakes.FakeRunner).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from backends.torch_engine.seams import RunnerOutput, SchedulerOutput
from tests.engine.torch_engine_fakes import FakePagedKV

PIECES = [
    "<eos>",
    "{",
    "}",
    '"',
    "a",
    "b",
    ":",
    ",",
    "0",
    "1",
    "2",
    "9",
    "true",
    "false",
    "null",
    " ",
    "\n",
    '{"',
    '":',
    '","',
    "[",
    "]",
    "<",
    ">",
    "x",
    "ab",
]
EOS = 0
VOCAB = len(PIECES)


class TinyTokenizer:
    vocab_size = VOCAB

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Greedy longest match (every text made of PIECES[1:] encodes)."""
        ids, i = [], 0
        while i < len(text):
            best = max((j for j in range(1, VOCAB) if text.startswith(PIECES[j], i)), key=lambda j: len(PIECES[j]))
            ids.append(best)
            i += len(PIECES[best])
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(PIECES[i] for i in token_ids)

    def token_bytes(self, token_ids: Sequence[int]) -> bytes:
        return "".join(PIECES[i] for i in token_ids if i != EOS).encode()


class TinyRunner:
    def __init__(self, num_blocks: int, vocab: int = VOCAB) -> None:
        self.kv = FakePagedKV(num_blocks)
        self.num_blocks = num_blocks
        self.vocab = vocab
        self.steps: list[SchedulerOutput] = []

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        import torch

        self.steps.append(out)
        contexts = self.kv.run(out)
        ids = tuple(s.request_id for s in out.scheduled if s.needs_logits)
        rows = [
            torch.rand(self.vocab, generator=torch.Generator().manual_seed(zlib.crc32(repr(contexts[r]).encode()))) * 4
            for r in ids
        ]
        return RunnerOutput(ids, torch.stack(rows) if rows else torch.empty(0, self.vocab))


def tiny_compiler():
    from backends.constrained import compiler_for_tokenizer

    return compiler_for_tokenizer(TinyTokenizer(), [EOS], None)


def tiny_build(num_blocks: int = 64, vocab: int = VOCAB):
    """A `build` for TorchBackend over the tiny vocabulary (vocab > VOCAB: a padded embedding)."""
    from backends.torch_engine.parts import EngineParts

    def build(spec, options, progress):
        return EngineParts(runner=TinyRunner(num_blocks, vocab), tokenizer=TinyTokenizer(), num_blocks=num_blocks)

    return build


def tiny_spec():
    import dataclasses

    from tests.engine.torch_engine_fakes import fake_spec

    return dataclasses.replace(fake_spec(eos=(EOS,)), vocab_size=VOCAB)
