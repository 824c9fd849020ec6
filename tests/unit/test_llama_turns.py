"""backends/llama_cpp/turns.py on a stand-in for llama-cpp-python's Llama (its context's ids, n_tokens, eval and
sampler): a parked generation gets back exactly its context and its own sampler object, from the copied cells
without evaluating anything, or (no copy) re-evaluating only what the other request changed; a long prompt goes in
pieces sized by time (at most n_batch).  The real cells: tests/e2e/test_llama_cpp_preemption.py."""

from __future__ import annotations

import numpy as np

from backends.llama_cpp.turns import FIRST_PIECE, PIECE_S, PieceSizer, park, prefill_piece, resume


class FakeLlama:
    """What turns.py touches of Llama: input_ids/n_tokens, eval (which drops the cache from n_tokens on, as
    Llama.eval does), _sampler; it records every eval."""

    def __init__(self, n_ctx: int = 256) -> None:
        self.input_ids = np.zeros(n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self._sampler: object = None
        self.evals: list[list[int]] = []

    def eval(self, tokens: list[int]) -> None:
        self.evals.append(list(tokens))
        self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def context(self) -> list[int]:
        return [int(t) for t in self.input_ids[: self.n_tokens]]


def _no_copy(llm: FakeLlama) -> None:
    return None


def test_resume_writes_the_copied_cells_back_and_evaluates_nothing() -> None:
    llm = FakeLlama()
    llm.eval([1, 2, 3, 4])
    llm._sampler = mine = object()
    parked = park(llm, save_kv=lambda _: "cells of 1 2 3 4")
    llm.n_tokens = 1
    llm.eval([8, 8])
    llm._sampler = object()
    llm.evals.clear()
    written = []
    assert resume(llm, parked, load_kv=lambda _, kv: written.append(kv) or True) == 0
    assert written == ["cells of 1 2 3 4"] and llm.evals == []
    assert llm.context() == [1, 2, 3, 4] and llm._sampler is mine


def test_a_refused_copy_falls_back_to_evaluating_everything() -> None:
    llm = FakeLlama()
    llm.eval([1, 2, 3])
    parked = park(llm, save_kv=lambda _: "cells")
    llm.evals.clear()
    assert resume(llm, parked, load_kv=lambda _, kv: False) == 3  # the sequence was cleared for the cells
    assert llm.evals == [[1, 2, 3]] and llm.context() == [1, 2, 3]


def test_resume_restores_the_context_and_the_very_sampler() -> None:
    llm = FakeLlama()
    mine = object()
    llm.eval([1, 2, 3, 4, 5, 6])  # a shared system prompt 1, 2, 3, then this request's 4, 5, 6
    llm._sampler = mine
    parked = park(llm, save_kv=_no_copy)
    # another request takes the context: keeps the shared prefix, writes its own tokens and sampler
    llm.n_tokens = 3
    llm.eval([9, 9, 9, 9, 9])
    llm._sampler = object()
    llm.evals.clear()
    assert resume(llm, parked) == 3  # only 4, 5, 6 again
    assert llm.context() == [1, 2, 3, 4, 5, 6] and llm.evals == [[4, 5, 6]]
    assert llm._sampler is mine


def test_resume_evaluates_nothing_when_the_context_still_holds_it() -> None:
    llm = FakeLlama()
    llm.eval([1, 2, 3])
    llm._sampler = mine = object()
    parked = park(llm, save_kv=_no_copy)
    llm.eval([7, 8])  # a request that only extended it (the cache past n_tokens is dropped at the next eval)
    llm.evals.clear()
    assert resume(llm, parked) == 0 and llm.evals == [] and llm.n_tokens == 3 and llm._sampler is mine


def test_prefill_goes_in_pieces_and_leaves_the_last_token_to_generate() -> None:
    llm = FakeLlama()
    ids = list(range(10, 60))  # 50 tokens
    llm.eval(ids[:7])  # a prefix cached from an earlier request
    llm.evals.clear()
    while prefill_piece(llm, ids, piece=16):
        pass
    assert [len(e) for e in llm.evals] == [16, 16]  # 7 + 32 done; 11 left (<= 16), generate() evaluates them
    assert llm.context() == ids[:39]


def test_prefill_continues_from_what_another_request_left() -> None:
    llm = FakeLlama()
    ids = list(range(100, 140))
    assert prefill_piece(llm, ids, piece=8)
    llm.n_tokens = 2  # another request ran meanwhile and kept only the first two tokens of ours
    llm.eval([5, 5, 5])
    llm.evals.clear()
    assert prefill_piece(llm, ids, piece=8)
    assert llm.evals == [ids[2:10]] and llm.context() == ids[:10]


def test_pieces_are_sized_by_time_not_by_the_batch() -> None:
    """A chat message waits for the piece in progress: on a CPU that evaluates 260 tokens/s (the starter on 2 Xeon
    cores) a piece is ~64 tokens (0.25 s), not n_batch's 512 (2 s); on a GPU the pieces grow to n_batch."""
    cpu = PieceSizer(512)
    assert cpu.size == FIRST_PIECE
    assert cpu.timed(64, 64 / 260) == 64  # 260 tok/s x PIECE_S = 65 -> 64, whole multiples of 16
    assert cpu.timed(64, 2.0) == 16  # a piece that crawled (a second process took the cores): the least piece
    assert cpu.size * 2.0 / 64 <= 2 * PIECE_S
    gpu = PieceSizer(512)
    assert gpu.timed(64, 0.004) == 512  # 16k tok/s: n_batch is the most a piece takes
    assert PieceSizer(8).size == 16 and PieceSizer(32).size == 32
