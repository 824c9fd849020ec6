"""What an engine's kernel self-check says, as `hearth doctor` prints it: typed, pure Python, so the app reads it
without importing the engine (the check itself runs in a runner process: backends/runner/oneshot.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecordedTable:
    """One device's recorded verdicts (the kernel self-check record, one entry per device key)."""

    key: dict[str, str]  # device, cc, driver, torch, triton, hearth, dtype, interpreter
    lines: tuple[str, ...]  # the table: kernel, max error, time vs the torch op, verdict; then graphs and timing


@dataclass(frozen=True)
class KernelReport:
    """`hearth doctor`'s kernel section: the check run now (when asked) and every device's recorded table."""

    checked: bool = False  # a check ran now (`hearth doctor --kernels`)
    replaced: tuple[str, ...] = ()  # the kernels that check replaced by their torch op on this device
    reasons: tuple[str, ...] = ()  # that check's lines: a summary first, then one per replaced kernel
    tables: tuple[RecordedTable, ...] = ()  # every device in the record, after the check (if any)
