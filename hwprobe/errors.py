"""The root of hearth's one error hierarchy.

It lives here because hwprobe is the lowest hearth package that the others may import (backends and app import
hwprobe; hwprobe imports only the standard library), so every layer can raise and catch the same types.
`backends.errors` adds the model and runtime errors on top.

Every HearthError carries a one-line message that states what is wrong with the numbers involved, and a `hint`
that says what to do.  The CLI prints `hearth: error: <message>` and, when there is one, `  hint: <hint>`, then
exits with `exit_code` (2 for bad input, the argparse convention).
"""

from __future__ import annotations


class HearthError(Exception):
    """Base class of every error hearth raises on purpose."""

    exit_code: int = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"

    def one_line(self) -> str:
        """The message and its hint on one line, for logs, notifications and API error bodies."""
        return str(self)


class ConfigError(HearthError):
    """A setting, flag, environment variable or config file value is invalid."""


class HardwareReportError(HearthError):
    """A saved HardwareReport (--hardware FILE) is missing, unreadable or malformed."""


class PlanError(HearthError):
    """No plan fits: the model cannot run on this machine with the requested settings."""
