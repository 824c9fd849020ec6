"""How many threads llama.cpp computes with: the count asked for, or fewer when other processes keep cores busy.

ggml's thread team spins at a barrier after every op; a team with more threads than free cores waits for a time
slice at each one.  Measured on the 2-core Xeon with one core kept busy by a spinning process: the starter
decoded 0.4 tok/s at 2 threads (`hearth bench --busy-cores 1`; 80 tok/s quiet), where one thread keeps most of
its quiet speed.  Unless the user fixed the count (--threads N), the backend starts from the cores other
processes left free while it loaded (hwprobe/spare_cores.py).  llama.cpp keeps that count for the model's life:
unlike the torch engine (backends/torch_engine/threads.py) it is not re-measured as the load changes.
"""

from __future__ import annotations


def threads_to_use(asked: int, adaptive: bool, spare: float | None) -> tuple[int, str | None]:
    """(threads, note): `asked` unless the count is adaptive and fewer cores were spare (rounded, at least one);
    the note says why when it differs."""
    if not adaptive or spare is None:
        return asked, None
    free = max(1, round(spare))
    if free >= asked:
        return asked, None
    return free, (
        f"threads {free} of {asked}: other processes kept {asked - spare:.1f} cores busy while the model loaded "
        "(a thread team larger than the free cores stalls at every op; --threads N fixes the count)"
    )
