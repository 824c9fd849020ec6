"""When llama.cpp may use its extra weight-buffer types: off on AMX CPUs until `hearth doctor` passed there."""

from __future__ import annotations

import pytest

import backends.llama_cpp.extra_bufts as rule
from backends.llama_cpp.extra_bufts import extra_bufts_default


@pytest.mark.parametrize(
    "amx,checked,env,want",
    [
        (False, False, "", True),
        (True, False, "", False),
        (True, True, "", True),  # the doctor's check passed with this build on this machine
        (True, True, "0", False),  # the environment overrides the check
        (False, False, "0", False),
        (True, False, "1", True),
    ],
)
def test_extra_bufts_rule(monkeypatch, amx, checked, env, want) -> None:
    monkeypatch.setattr(rule, "has_amx", lambda cpuinfo="/proc/cpuinfo": amx)
    monkeypatch.setenv("HEARTH_LLAMA_EXTRA_BUFTS", env)
    on, why = extra_bufts_default(lambda: checked)
    assert on is want and why
