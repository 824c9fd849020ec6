"""Quality-of-service settings (issue 27): the app's own priority and the TTFT target, from file, env and flags;
bad values are one-line errors (exit 2); the request builder carries the priority."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.defaults import APP_PRIORITY, TTFT_TARGET_MS
from app.requests import chat_request
from app.settings import Settings, load_settings
from backends.api import API_PRIORITY, LoadOptions, Request, SamplingParams
from backends.errors import ConfigError, InvalidRequestError
from tests.fakes import fake_spec


def test_defaults_rank_the_app_ahead_of_the_api() -> None:
    assert APP_PRIORITY < API_PRIORITY == Request(prompt="x").priority == 0
    assert Settings().priority == APP_PRIORITY and Settings().ttft_target_ms == TTFT_TARGET_MS == 500
    assert LoadOptions().ttft_target_ms == 500


def test_file_env_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "settings.toml"
    f.write_text("priority = 3\nttft_target_ms = 250\n")
    s = load_settings(f, env={})
    assert (s.priority, s.ttft_target_ms) == (3, 250.0)
    s = load_settings(f, env={"HEARTH_TTFT_TARGET_MS": "800"}, priority=-5)
    assert (s.priority, s.ttft_target_ms) == (-5, 800.0)


@pytest.mark.parametrize(
    "flags, match",
    [({"priority": 101}, "priority must be from -100 to 100"), ({"ttft_target_ms": -1.0}, "ttft_target_ms")],
)
def test_bad_values_are_named(tmp_path: Path, flags: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(tmp_path / "none.toml", env={}, **flags)


def test_bad_flags_exit_2_with_one_line(capsys) -> None:
    assert main(["run", "--priority", "500", "hi"]) == 2
    err = capsys.readouterr().err
    assert "priority must be from -100 to 100" in err and "Traceback" not in err
    assert main(["run", "--ttft-target-ms", "-3", "hi"]) == 2
    assert "ttft_target_ms must be from 0" in capsys.readouterr().err


def test_help_documents_the_flags(capsys) -> None:
    for command, flag in (("run", "--priority"), ("run", "--ttft-target-ms"), ("serve", "--ttft-target-ms")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert flag in capsys.readouterr().out


def test_request_priority_is_bounded_and_carried() -> None:
    for bad in (101, -101, True, 1.0, "1"):
        with pytest.raises(InvalidRequestError, match="priority must be an integer"):
            Request(prompt="x", priority=bad)  # type: ignore[arg-type]
    built = chat_request(fake_spec(), [{"role": "user", "content": "hi"}], SamplingParams(), priority=-1)
    assert built.request.priority == -1
    assert chat_request(fake_spec(), [{"role": "user", "content": "hi"}], SamplingParams()).request.priority == 0
