"""Settings read from the environment by the backends layer (the app's own live in app/settings.py)."""

from __future__ import annotations

import os

from backends.errors import ConfigError


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from environment variable `name`, `default` when it is unset or empty.
    A value that is not a positive number is a ConfigError naming the variable (STYLE rule 1: never silently
    ignored: a typo in a timeout would otherwise run with a different one than the user meant)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}", f"unset {name} for {default:g}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, got {raw!r}", f"unset {name} for {default:g}")
    return value
