"""The llama.cpp backend's thread count (backends/llama_cpp/threads.py): fewer threads than asked only when the
count is adaptive and other processes kept cores busy while the model loaded."""

from __future__ import annotations

from backends.llama_cpp.threads import threads_to_use


def test_a_quiet_machine_keeps_the_count_asked() -> None:
    assert threads_to_use(2, True, 1.9) == (2, None)
    assert threads_to_use(2, True, 2.0) == (2, None)
    assert threads_to_use(2, True, None) == (2, None)  # no measure: as asked


def test_a_busy_core_costs_a_thread_and_says_why() -> None:
    threads, note = threads_to_use(2, True, 1.0)
    assert threads == 1 and note is not None and "1.0 cores busy" in note and "--threads" in note
    assert threads_to_use(16, True, 11.6)[0] == 12
    assert threads_to_use(4, True, 0.0)[0] == 1  # never fewer than one


def test_a_count_the_user_fixed_is_kept() -> None:
    assert threads_to_use(2, False, 0.2) == (2, None)


class FakeLlama:
    """What LlamaThreads touches of llama_cpp.Llama: the context's thread setter and the reported counts."""

    def __init__(self, n: int) -> None:
        import types

        self.n_threads = self.n_threads_batch = n
        self.context_params = types.SimpleNamespace(n_threads=n, n_threads_batch=n)
        self.calls: list[tuple[int, int]] = []
        self._ctx = types.SimpleNamespace(set_n_threads=lambda a, b: self.calls.append((a, b)))


def test_adaptive_threads_start_where_the_load_found_the_machine_and_time_decoded_tokens() -> None:
    from backends.llama_cpp.threads import LlamaThreads

    llm = FakeLlama(2)
    t = LlamaThreads(llm, 2, adaptive=True, start=1)
    assert t.threads == 1 and llm.calls == [(1, 1)]
    assert llm.n_threads == llm.n_threads_batch == llm.context_params.n_threads_batch == 1
    assert t.step(False, lambda: "prompt") == "prompt"  # prompt evaluation: run, never timed
    for _ in range(8):
        assert t.step(True, lambda: 7) == 7
    assert t.tuner is not None and len(t.tuner._recent) == 4  # the decoded tokens fill the tuner's window


def test_fixed_threads_are_never_tuned_nor_changed() -> None:
    from backends.llama_cpp.threads import LlamaThreads

    llm = FakeLlama(2)
    t = LlamaThreads(llm, 2, adaptive=False, start=2)
    assert t.tuner is None and t.threads == 2 and llm.calls == []
    assert t.step(True, lambda: 3) == 3
