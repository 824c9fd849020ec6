"""`hearth chat` (and plain `hearth`): the chat app.

Until the Textual TUI lands this opens the interactive terminal chat of `hearth run`.
"""

from __future__ import annotations

import argparse

from app.commands.common import add_model_arguments

NAME = "chat"
HELP = "open the chat (the default when `hearth` runs with no command)"
ORDER = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)


def run(args: argparse.Namespace) -> int:
    from app.commands import run as run_cmd

    for name in ("prompt", "system_prompt", "stop", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                 "seed", "max_tokens"):
        setattr(args, name, None)
    args.raw = False
    args.verbose = getattr(args, "verbose", False)
    return run_cmd.run(args)
