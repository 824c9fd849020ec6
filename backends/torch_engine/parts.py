"""What the model half hands the engine half, and the KV pool's size: the module both halves import.

The engine half (backend.py: threads, scheduler, sampler) builds the model half (model_runner.py: weights, KV
pool, tokenizer) through `build_parts`; the model half returns `EngineParts`.  Both need these types and
`kv_pool_blocks`, so they live here, below both, and neither half imports the other's module at runtime except
backend.py's lazy `build_parts` (the one arrow, engine -> model).  Pure Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from backends.api import LoadOptions
from backends.modelspec import ModelSpec
from backends.torch_engine.seams import BLOCK_SIZE, RunnerOutput, SchedulerOutput
from backends.torch_engine.swap_cost import SwapCost


class Runner(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput: ...


class Tokenizer(Protocol):
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...
    def token_bytes(self, token_ids: Sequence[int]) -> bytes: ...  # reply text: control tokens give b""


@dataclass
class EngineParts:
    """What the model half provides to the engine."""

    runner: Runner  # execute(SchedulerOutput) -> RunnerOutput, over a KV pool of num_blocks blocks
    tokenizer: Tokenizer
    num_blocks: int  # blocks in the runner's KV pool
    # (ids, block_table) -> (len(ids), vocab) float32 tensor: logits after every position, computed over the
    # given blocks (the backend takes them from the block manager, so no live or cached prefix is overwritten)
    prompt_logits: Callable[[Sequence[int], Sequence[int]], Any] | None = None
    # ([(ids, block_table), ...], pooling) -> one (hidden,) float32 tensor per input: the pooled, L2-normalized
    # last hidden states (embeddings), each over its blocks as prompt_logits, several inputs to a forward
    # (ModelRunner.embed_batch); None = this build gives no embeddings
    embed: Callable[[Sequence[tuple[Sequence[int], Sequence[int]]], str], Sequence[Any]] | None = None
    describe: Callable[[], dict[str, Any]] | None = None  # device, dtype, KV pool bytes, ...
    close: Callable[[], None] | None = None
    # speculative decoding (backends.torch_engine.speculative.speculator.Speculator), None = off
    speculator: Any = None
    # swap space (a GPU engine, backends/torch_engine/kv_swap.py): host slots the block manager hands out, and
    # what a swap costs; 0 / None = preempted requests are recomputed
    num_host_blocks: int = 0
    swap_cost: SwapCost | None = None


def kv_pool_blocks(spec: ModelSpec, options: LoadOptions, bytes_per_element: int, n_kv_heads: int | None = None) -> int:
    """Blocks in the KV pool: LoadOptions.kv_cache_bytes when set, else enough for max_num_seqs sequences of
    n_ctx tokens (what the plan budgets).  One block holds K and V of BLOCK_SIZE tokens in every layer.
    n_kv_heads: the KV heads one device holds (tensor parallelism: the most any rank holds, so that every rank
    has the same blocks and kv_cache_bytes is what each device gives the pool); default all of them."""
    heads = spec.n_kv_heads if n_kv_heads is None else n_kv_heads
    block_bytes = 2 * spec.n_layers * heads * spec.head_dim * bytes_per_element * BLOCK_SIZE
    if options.kv_cache_bytes is not None:
        return max(options.kv_cache_bytes // block_bytes, 1)
    return options.max_num_seqs * -(-options.n_ctx // BLOCK_SIZE)
