"""A runner of its own for one call (backends/runner/oneshot.py): `hearth doctor`'s kernel report comes back
typed; an engine without a kernel self-check gives the empty report; a refusal in the child is raised as the
same HearthError in hearth's process.  (The torch engine's real check: tests/engine/test_kernel_check.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.errors import BackendUnavailableError
from backends.kernel_report import KernelReport
from backends.runner.oneshot import kernel_report
from tests.fakes import fake_spec


def test_an_engine_without_a_kernel_check_reports_nothing(tmp_path: Path) -> None:
    report = kernel_report(fake_spec(), "llama.cpp", tmp_path / "none.json", check_now=True, log_dir=tmp_path)
    assert report == KernelReport()


def test_an_unknown_engine_is_the_childs_error_raised_here(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError, match="unknown backend 'nope'"):
        kernel_report(fake_spec(), "nope", tmp_path / "none.json", check_now=False, log_dir=tmp_path)
