"""The searches the planner runs to find what fits: a candidate's fit (every device within its budget), the most
layers a GPU holds, the largest context that fits.  Split from hwprobe/planner.py, which decides among what these
find; they only price (hwprobe.placement) and bisect."""

from __future__ import annotations

from collections.abc import Callable

from hwprobe.placement import Candidate, price
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape

CTX_STEP = 256  # contexts are planned in multiples of this


def fits(report: HardwareReport, shape: ModelShape, c: Candidate) -> bool:
    """Every device of candidate c within its budget."""
    return all(d.headroom_mib >= 0 for d in price(report, shape, c))


def fits_gpus(report: HardwareReport, shape: ModelShape, c: Candidate) -> bool:
    """The GPUs' part of fits: monotone in n_gpu_layers (more layers, more VRAM), so it can be bisected; host
    RAM is the other way round (fewer layers on the GPU, more in RAM), so the whole fit is not."""
    return all(d.headroom_mib >= 0 for d in price(report, shape, c) if d.kind == "gpu")


def most_layers(report: HardwareReport, shape: ModelShape, make: Callable[[int], Candidate]) -> Candidate | None:
    """make(n) for the most layers 1 <= n < n_layers on the GPUs that fits everywhere, or None.  The most layers
    the GPUs hold leaves the least in host RAM: if RAM does not hold that, it holds no fewer layers either."""
    n = largest(1, shape.n_layers - 1, lambda n: fits_gpus(report, shape, make(n)))
    return make(n) if n is not None and fits(report, shape, make(n)) else None


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest x in [lo, hi] with ok(x), for ok monotone (true below some point); None if ok(lo) fails."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def best_ctx(
    report: HardwareReport, shape: ModelShape, make: Callable[[int], Candidate], lo: int, hi: int
) -> int | None:
    """The largest context in [lo, hi] (hi itself, else a multiple of CTX_STEP) whose candidate fits."""
    if fits(report, shape, make(hi)):
        return hi
    if lo >= hi:
        return None
    k = largest(-(-lo // CTX_STEP), (hi - 1) // CTX_STEP, lambda k: fits(report, shape, make(k * CTX_STEP)))
    return None if k is None else k * CTX_STEP
