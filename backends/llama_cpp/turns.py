"""Handing llama.cpp's one context to a better-ranked request and taking it back (priority preemption).

llama-cpp-python's `Llama` holds one sequence: its KV cache, the token ids in it (`input_ids[:n_tokens]`) and the
sampler chain of the generation in progress (`_sampler`, rebuilt by every `generate()`).  A generation that gives
its turn away (backends/priority.py PriorityLock.yield_turn) parks all three: a copy of its sequence's KV cells
(llama_state_seq_get_data: the cells in use, not the whole cache), its ids and its sampler; the request that runs
meanwhile replaces them.  When the turn comes back, `resume` writes the cells back and puts the ids and the
sampler in place, so the generator continues exactly where it stopped: the same cache bytes, the same seeded
random stream, the same penalty history, the same tokens as if it had never been interrupted.

Why a copy, not a re-evaluation: a long prompt preempted again and again by a steady stream of chat messages would
start its prefill over at every turn and might never finish; a copy costs a memcpy (the starter: ~23 KB a token;
an 8B model's f16 cache: 128 KB a token, ~1 GiB at 8k tokens, from VRAM over PCIe in tens of ms).  At most one
generation is parked at a time per model (the server admits one request past the slot limit, for preemption:
app/server/admission.py).  When the copy would take more than half the memory free now, the cells are not copied
and `resume` re-evaluates the ids instead (only what differs from what the other request left).

Long prompts are evaluated `piece` tokens at a time (`prefill_piece`) so that a better-ranked request also gets the
context between the pieces of a long prefill, not after all of it.  A piece is sized by time, not by llama.cpp's
n_batch (`PieceSizer`): what a chat message waits for is the piece in progress, and on a CPU a 512-token batch is
seconds (the starter on 2 Xeon cores, extra buffer types off: 2.2 s at 512 tokens, 0.3 s at 64, the same ~260
tokens/s either way), where on a GPU it is milliseconds (the pieces grow to n_batch after the first).

Every function here runs on the backend's llama.cpp thread (one_thread.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Parked:
    """A generation's place in the context while another request holds it."""

    ids: tuple[int, ...]  # the token ids its context held (prompt and generated, but for the last sampled token)
    sampler: Any  # llama-cpp-python's LlamaSampler of the generation (kept alive by this reference)
    kv: Any  # its sequence's KV cells as llama.cpp serialised them (a ctypes buffer), or None: re-evaluate the ids


def park(llm: Any, save_kv: Callable[[Any], Any] | None = None) -> Parked:
    ids = tuple(int(t) for t in llm.input_ids[: llm.n_tokens])
    return Parked(ids, llm._sampler, (save_kv or kv_snapshot)(llm))


def resume(llm: Any, parked: Parked, load_kv: Callable[[Any, Any], bool] | None = None) -> int:
    """Put the parked context and sampler back; returns the tokens re-evaluated (0 when the cells were copied)."""
    ids = list(parked.ids)
    llm._sampler = parked.sampler
    if parked.kv is not None:
        if (load_kv or kv_restore)(llm, parked.kv):
            llm.input_ids[: len(ids)] = ids
            llm.n_tokens = len(ids)
            return 0
        llm.n_tokens = 0  # the cells could not be written back, and the sequence was cleared for them
    common = common_prefix(llm.input_ids[: llm.n_tokens], ids)
    llm.n_tokens = common  # Llama.eval drops the cache from n_tokens on before it decodes
    if common < len(ids):
        llm.eval(ids[common:])
    return len(ids) - common


def kv_snapshot(llm: Any) -> Any:
    """Sequence 0's KV cells, serialised by llama.cpp, or None when the copy would take more than half the memory
    that is free now (or llama.cpp could not write it)."""
    import ctypes  # lazy: only a preemption needs it

    import llama_cpp  # lazy: heavy: llama_cpp
    import psutil  # lazy: only a preemption needs it

    ctx = llm._ctx.ctx
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    if size <= 0 or size > psutil.virtual_memory().available // 2:
        return None
    buf = (ctypes.c_uint8 * size)()
    return buf if int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)) == size else None


def kv_restore(llm: Any, kv: Any) -> bool:
    """Sequence 0's cells replaced by a kv_snapshot; False when llama.cpp refused it (the sequence is then empty)."""
    import ctypes  # lazy: only a preemption needs it

    import llama_cpp  # lazy: heavy: llama_cpp

    llm._ctx.kv_cache_seq_rm(0, 0, -1)
    return int(llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, kv, ctypes.sizeof(kv), 0)) > 0


def prefill_piece(llm: Any, ids: Sequence[int], piece: int) -> bool:
    """Evaluate the next `piece` tokens of the prompt `ids` after what the cache already holds of it; False when
    at most `piece` tokens are left (generate() evaluates those itself, and always the last token: it samples from
    that token's logits).  `piece` is PieceSizer's (at most n_batch: one llama.cpp decode call a piece)."""
    done = common_prefix(llm.input_ids[: llm.n_tokens], ids)
    done = min(done, len(ids) - 1)
    if len(ids) - 1 - done <= piece:
        return False
    llm.n_tokens = done
    llm.eval(list(ids[done : done + piece]))
    return True


PIECE_S = 0.25  # a prompt piece's target time: about what a better-ranked request waits for the context
FIRST_PIECE = 64  # tokens of a prompt's first piece, before its rate is known
PIECE_STEP = 16  # pieces are whole multiples of this (the KV cache's block)


class PieceSizer:
    """The next prompt piece's length: as many tokens as the last piece's rate evaluates in PIECE_S, between
    PIECE_STEP and n_batch (a larger piece would be split by llama.cpp anyway)."""

    def __init__(self, n_batch: int) -> None:
        self.limit = max(PIECE_STEP, int(n_batch))
        self.size = min(FIRST_PIECE, self.limit)

    def timed(self, tokens: int, seconds: float) -> int:
        """Record that `tokens` took `seconds`; the next piece's size."""
        rate = tokens / max(seconds, 1e-6)
        fitting = int(rate * PIECE_S) // PIECE_STEP * PIECE_STEP
        self.size = max(PIECE_STEP, min(self.limit, fitting))
        return self.size


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
