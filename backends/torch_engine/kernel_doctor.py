"""`hearth doctor`'s kernel section, run inside a runner process (backends/runner/oneshot.py): the self-check of
every Triton kernel a model could call, checked now when asked, and the recorded table of every device.

A runner of its own, with no model loaded, so that on a machine without a GPU TRITON_INTERPRET=1 is set before
any Triton kernel is defined (the interpreter runs them on CPU, slowly but with the same code).
"""

from __future__ import annotations

import os

from backends.kernel_report import KernelReport, RecordedTable
from backends.modelspec import ModelSpec


def doctor_report(spec: ModelSpec, record: str, check_now: bool) -> KernelReport:
    """The check of `spec`'s kernels now (when `check_now`), recorded in `record`, and every recorded table."""
    import torch  # lazy: heavy: torch (~3 s); decides TRITON_INTERPRET below, before any kernel is defined

    if check_now and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    # lazy: heavy: torch, triton; and kernel_check defines the Triton kernels, so it follows TRITON_INTERPRET
    from backends.torch_engine.kernel_check import doctor_check, recorded_tables

    replaced: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    if check_now:
        check = doctor_check(spec, record)
        replaced = tuple(v.name for v in check.replaced)
        reasons = tuple(check.reasons())
    tables = tuple(RecordedTable(dict(key), tuple(lines)) for key, lines in recorded_tables(record))
    return KernelReport(checked=check_now, replaced=replaced, reasons=reasons, tables=tables)
