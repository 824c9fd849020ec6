from pathlib import Path

import pytest

from app.settings import Settings, load_settings
from hwprobe.errors import ConfigError


def test_file_env_flags_precedence(tmp_path: Path) -> None:
    f = tmp_path / "settings.toml"
    f.write_text('model = "a"\ntemperature = 0.5\nctx = 2048\n[server]\nport = 9000\n')
    s = load_settings(f, env={})
    assert (s.model, s.temperature, s.ctx, s.port) == ("a", 0.5, 2048, 9000)
    s = load_settings(f, env={"HEARTH_MODEL": "b", "HEARTH_CTX": "4096"})
    assert (s.model, s.ctx) == ("b", 4096)
    s = load_settings(f, env={"HEARTH_MODEL": "b"}, model="c", ctx=None)
    assert (s.model, s.ctx) == ("c", 2048)


@pytest.mark.parametrize(
    "text, match",
    [
        ("modle = 'x'", "unknown setting 'modle'"),
        ("temperature = 'hot'", "temperature must be float"),
        ("[server]\nprt = 1", r"unknown setting \[server\] prt"),
        ("backend = 'vllm'", "backend must be one of"),
        ("ctx = 3", "at least 16"),
        ("this is not toml", "not valid TOML"),
    ],
)
def test_invalid_settings_are_named(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "settings.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_settings(f, env={})


def test_bad_env_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="HEARTH_CTX"):
        load_settings(tmp_path / "none.toml", env={"HEARTH_CTX": "lots"})


def test_merged_ignores_none_and_rejects_unknown() -> None:
    s = Settings().merged(temperature=None, seed=3)
    assert s.seed == 3 and s.temperature == Settings().temperature
    with pytest.raises(ConfigError):
        Settings().merged(nonsense=1)


def test_speculative_settings_are_checked_with_the_way_out(tmp_path) -> None:
    assert load_settings(tmp_path / "none.toml", env={}, speculative="ngram").speculative == "ngram"
    assert load_settings(tmp_path / "none.toml", env={"HEARTH_SPECULATIVE": "auto"}).speculative == "auto"
    with pytest.raises(ConfigError, match="off, ngram, draft or auto"):
        load_settings(tmp_path / "none.toml", env={}, speculative="fast")
    with pytest.raises(ConfigError, match="--draft-model"):
        load_settings(tmp_path / "none.toml", env={}, speculative="draft")
