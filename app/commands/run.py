"""`hearth run`: one prompt streamed to stdout, or an interactive terminal chat (like `ollama run`)."""

from __future__ import annotations

import argparse
import sys

from app.commands.common import KEEP_ALIVE, add_model_arguments, add_sampling_arguments, settings_from_args
from app.defaults import SYSTEM_PROMPT
from backends.errors import InvalidRequestError

NAME = "run"
HELP = "stream a reply to PROMPT, or chat in the terminal when no PROMPT is given"
ORDER = 10
DESCRIPTION = """Stream a reply from a local model.

  hearth run "What is the capital of France?"     one prompt, reply on stdout
  echo "Summarise: ..." | hearth run -             prompt from stdin
  hearth run                                       interactive multi-turn chat (/help inside)

The plan picks backend, context and GPU layers for this machine (`hearth plan` shows it); flags override it.
--verbose prints the plan and the stats (tokens/s, time to first token) to stderr.

Structured output: --json-schema FILE constrains the reply to JSON valid against the schema in FILE (at most
64 KiB, 32 levels deep; JSON Schema as llguidance implements it), --json to any JSON object:

  hearth run --json-schema person.json "Invent a person with a name and an age"   {"name":"Ada","age":36}"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help="the prompt; - reads stdin; omit for a chat")
    p.add_argument(
        "--system",
        dest="system_prompt",
        metavar="TEXT",
        help=f'system prompt (default "{SYSTEM_PROMPT}"; "" sends none)',
    )
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="send PROMPT as is, without the chat template")
    p.add_argument("--verbose", "-v", action="store_true", help="print the plan and stats to stderr")
    j = p.add_mutually_exclusive_group()
    j.add_argument(
        "--json-schema",
        dest="json_output",
        metavar="FILE",
        help="reply with JSON valid against the JSON Schema in FILE (constrained decoding: the reply "
        "always parses; a max-tokens cut leaves it unfinished)",
    )
    j.add_argument(
        "--json", dest="json_output", action="store_const", const="object", help="reply with a JSON object (any keys)"
    )
    add_model_arguments(p, remote=True)
    KEEP_ALIVE.add(p)
    add_sampling_arguments(p)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from app.runner_start import prestart  # lazy: keeps `hearth --help` light (+2 hearth modules)

    # the runner first: its interpreter and engine imports run on the other core while this process imports the
    # rest and plans (app/runner_start.py); open_backend sends it the model
    started = prestart(settings, lingers=True)
    try:
        # lazy: keeps `hearth --help` light (+atexit, base64, concurrent, 46 hearth modules)
        from app.chat_session import ChatSession, print_stats

        # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
        from app.loading import open_backend
        from app.structured import constraint_for  # lazy: keeps `hearth --help` light (+6 hearth modules)

        constraint_for(settings.json_output)  # a missing or bad schema file fails here, before a model loads
        prompt = args.prompt
        if prompt == "-":
            prompt = sys.stdin.read()
            if not prompt.strip():
                raise InvalidRequestError("stdin was empty: there is no prompt", "pipe some text into `hearth run -`")
        loaded = open_backend(settings, hardware_file=args.hardware, command="run", prestarted=started)
    except BaseException:
        if started is not None:  # a no-op once the load adopted it
            started.discard()
        raise
    try:
        session = ChatSession(loaded, settings, stop=tuple(args.stop or ()))
        if args.verbose:
            session.print_plan(sys.stderr)
        if prompt is None:
            # lazy: keeps `hearth --help` light (+atexit, base64, concurrent, 47 hearth modules)
            from app.terminal_chat import interactive_chat

            return interactive_chat(session, verbose=args.verbose)
        result = session.send(prompt, raw=args.raw, on_text=lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.verbose:
            print_stats(result, sys.stderr)
        if result.finish_reason.value != "error":
            return 0
        if not (args.verbose and result.error):  # never a non-zero exit without a line saying why
            print(
                f"hearth: error: {result.error or 'the backend ended the reply with an error and gave no reason'}",
                file=sys.stderr,
            )
        # a runner crash is 4; a schema whose grammar hit llguidance's limits mid-reply is bad input, like a
        # schema refused before the model ran (2); any other failure of the backend 3
        return {"runner_crashed": 4, "constraint_limit": 2}.get(result.error_code or "", 3)
    finally:
        loaded.backend.close()
