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
