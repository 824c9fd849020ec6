"""`hearth chat` (and plain `hearth`): the Textual chat app.

The window paints first; the model (the last used one, else the starter) loads in a worker meanwhile.
"""

from __future__ import annotations

import argparse

from app.commands.common import KEEP_ALIVE, add_model_arguments, settings_from_args

NAME = "chat"
HELP = "open the chat (the default when `hearth` runs with no command)"
DESCRIPTION = (
    "Open the chat app. Keys: Enter sends, Ctrl+J inserts a newline, Esc stops a reply, F1 lists "
    "every key. Conversations are saved as you go."
)
ORDER = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, remote=True)
    KEEP_ALIVE.add(p)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+platformdirs, sqlite3, 2 hearth modules)
    from app.conversations import ConversationStore
    from app.tui.app import HearthApp  # lazy: heavy: textual

    settings = settings_from_args(args)
    store = ConversationStore.open()  # a refused database is a ConfigError before the screen opens
    try:
        HearthApp(settings, conversations=store, hardware_file=getattr(args, "hardware", None)).run()
    finally:
        store.close()
    return 0
