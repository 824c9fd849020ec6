"""The interactive terminal chat of `hearth run` with no prompt (line-based, like `ollama run`).

Keys and commands: Enter sends; a line of three double quotes starts and ends a multi-line message;
Ctrl-C stops a reply in progress (what was generated is kept) or clears the line; Ctrl-D or /bye leaves.
/clear forgets the conversation, /system TEXT sets the system prompt, /stats toggles stats, /help lists these.
"""

from __future__ import annotations

import sys

from app.chat_session import ChatSession, print_stats
from hwprobe.errors import HearthError

HELP = """Commands:
  /help            this list
  /clear           start a new conversation (keeps the system prompt)
  /system TEXT     set the system prompt ("/system" alone removes it)
  /stats           show or hide tokens/s and time to first token after each reply
  /bye             leave (or Ctrl-D)
Enter sends. Start and end a multi-line message with a line of three double quotes.
Ctrl-C stops a reply in progress and keeps what was generated."""

MULTILINE = '"""'


def _read_message(prompt: str) -> str | None:
    """One message from the terminal; None on end of input."""
    try:
        line = input(prompt)
    except EOFError:
        return None
    if line.strip() != MULTILINE:
        return line
    lines = []
    while True:
        try:
            more = input("... ")
        except EOFError:
            break
        if more.strip() == MULTILINE:
            break
        lines.append(more)
    return "\n".join(lines)


def interactive_chat(session: ChatSession, verbose: bool = False) -> int:
    try:
        # lazy: optional dependency (ImportError handled)
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:  # pragma: no cover - Windows
        pass
    show_stats = verbose
    tty = sys.stdin.isatty()
    if tty:
        print(
            f"hearth: chatting with {session.loaded.entry.name} ({session.loaded.decision.backend}). "
            "/help for commands, Ctrl-D to leave.",
            file=sys.stderr,
        )
    while True:
        try:
            text = _read_message(">>> " if tty else "")
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if text is None:
            if tty:
                print(file=sys.stderr)
            return 0
        stripped = text.strip()
        if not stripped:
            continue
        if stripped.startswith("/"):
            cmd, _, rest = stripped.partition(" ")
            if cmd in ("/bye", "/exit", "/quit"):
                return 0
            if cmd == "/help":
                print(HELP, file=sys.stderr)
            elif cmd == "/clear":
                session.reset()
                print("(new conversation)", file=sys.stderr)
            elif cmd == "/system":
                session.set_system(rest.strip())
                print("(system prompt set)" if rest.strip() else "(system prompt removed)", file=sys.stderr)
            elif cmd == "/stats":
                show_stats = not show_stats
            else:
                print(f"unknown command {cmd}; /help lists them", file=sys.stderr)
            continue
        try:
            result = session.send(text, on_text=lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        except KeyboardInterrupt:
            print("\n(stopped)", file=sys.stderr)
            continue
        except HearthError as exc:  # e.g. the conversation outgrew the context: say so, keep chatting
            print(f"hearth: error: {exc.one_line()}", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        if result.finish_reason.value == "error":
            print(f"hearth: error: {result.error}", file=sys.stderr)
        elif show_stats:
            print_stats(result, sys.stderr)
