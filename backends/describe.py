"""What a loaded backend says about itself (`Backend.describe()`): a typed record, read by field where hearth
acts on a value (the TUI's context length, `hearth bench`'s KV bytes) and shown whole by `run --verbose`,
`hearth serve` and the TUI.

`backend`, `model` and `n_ctx` every backend knows; `facts` are the engine's own (layers on the GPU, KV
type, CUDA graphs, runner pid, ...), in the order they are shown.  It is also a read-only Mapping over all of
them (`d["n_ctx"]`, `d.get("kv_cache_bytes")`, `d.items()`), the shape describe() had as a plain dict, so
a display loop needs no special case.  Between hearth and a runner it travels as that flat mapping
(`as_dict()` / `from_mapping()`), with values of the `Fact` types only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Union

# what one fact may be; between hearth and its runners (msgpack) a tuple travels as a list: WireFact
Fact = Union[str, int, float, bool, None, list, tuple]  # noqa: UP007 - runtime aliases (msgspec reads them)
WireFact = Union[str, int, float, bool, None, list]  # noqa: UP007

_COMMON = ("backend", "model", "n_ctx")


@dataclass(frozen=True)
class Description(Mapping[str, Fact]):
    backend: str  # registry name ("llama.cpp", "torch", "remote"), as --backend takes it
    model: str  # the model's name
    n_ctx: int | None = None  # context loaded, in tokens; None = not known (a remote server that did not say)
    facts: dict[str, Fact] = field(default_factory=dict)  # the engine's own, in display order

    def __getitem__(self, key: str) -> Fact:
        if key in _COMMON:
            value = getattr(self, key)
            if value is None and key == "n_ctx":
                raise KeyError(key)
            return value
        return self.facts[key]

    def __iter__(self) -> Iterator[str]:
        yield "backend"
        yield "model"
        if self.n_ctx is not None:
            yield "n_ctx"
        yield from (k for k in self.facts if k not in _COMMON)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def with_facts(self, **more: Fact) -> Description:
        """A copy with more facts (a wrapper adding its own, e.g. the runner's pid)."""
        return Description(self.backend, self.model, self.n_ctx, {**self.facts, **more})

    def as_dict(self) -> dict[str, Fact]:
        return dict(self.items())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Fact]) -> Description:
        """From a flat mapping with at least "backend" and "model" (what describe() returned as a dict)."""
        facts = {k: v for k, v in data.items() if k not in _COMMON}
        n_ctx = data.get("n_ctx")
        n_ctx = n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else None
        return cls(str(data.get("backend", "")), str(data.get("model", "")), n_ctx, facts)
