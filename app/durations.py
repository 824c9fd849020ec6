"""Durations as people and Ollama write them: a number of seconds, or a Go duration ("5m", "1h30m", "300ms",
"10s").  Negative means "forever" (None), as Ollama's keep_alive.  Standard library only: Settings use it."""

from __future__ import annotations

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_ORDER = ("ns", "us", "µs", "ms", "s", "m", "h")


def duration_seconds(value: str | float | int, what: str = "keep_alive") -> float | None:
    """Seconds (None: forever); ValueError naming `what` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a duration (e.g. 5m, 30s, 1h) or a number of seconds")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = value.strip()
    if text.lstrip("-").replace(".", "", 1).isdigit():
        seconds = float(text)
        return None if seconds < 0 else seconds
    if text.startswith("-"):
        return None
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        c = text[i]
        if c.isdigit() or c == ".":
            number += c
            i += 1
            continue
        unit = next((u for u in _ORDER if text.startswith(u, i)), None)
        if unit is None or not number:
            raise ValueError(f"{what} {value!r} is not a duration (e.g. 5m, 30s, 1h) or a number of seconds")
        total += float(number) * _UNITS[unit]
        number = ""
        i += len(unit)
    if number:
        raise ValueError(f"{what} {value!r} is not a duration (e.g. 5m, 30s, 1h) or a number of seconds")
    return total
