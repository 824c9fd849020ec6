"""`hearth`: the command-line entry point.

Each subcommand is a module in `app/commands/` defining `NAME`, `HELP`, `ORDER`, `add_arguments(parser)` and
`run(args) -> int`; they are discovered, not listed, and import nothing heavy at module level, so
`hearth --help` and `hearth --version` answer instantly.  `hearth` with no subcommand opens the chat.

Errors: every HearthError becomes one line on stderr (`hearth: error: ...` plus a hint) and its exit code
(2 for bad input); a KeyboardInterrupt exits 130 quietly.  Set HEARTH_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

import app.commands as pkg
from app import __version__
from hwprobe.errors import HearthError

DEFAULT_COMMAND = "chat"  # what plain `hearth` runs


def _command_modules() -> list[ModuleType]:
    mods = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name == "common":
            continue
        mod = importlib.import_module(f"app.commands.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = argparse.ArgumentParser(
        prog="hearth",
        description="Local LLM inference on your own GPU or CPU. Run `hearth` to chat, "
        "`hearth COMMAND --help` for a command.",
        epilog="Environment: HEARTH_HOME relocates everything hearth writes; HEARTH_MODEL, HEARTH_BACKEND, "
        "HEARTH_CTX, HEARTH_API_KEY set defaults (settings file < environment < flags).",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the version and exit (with --verbose: libraries and GPU offload support)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="more detail (with --version, or per command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for mod in _command_modules():
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        modules[mod.NAME] = mod
        for alias in getattr(mod, "ALIASES", ()):
            modules[alias] = mod
    return parser, modules


def version_text(verbose: bool) -> str:
    if not verbose:
        return f"hearth {__version__}"
    # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 11 hearth modules)
    from app.versions import verbose_version

    return verbose_version()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_text(args.verbose))
        return 0
    if args.command is None:
        args = parser.parse_args([*argv, DEFAULT_COMMAND])
    mod = modules[args.command]
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hearth run ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as exc:
        if os.environ.get("HEARTH_DEBUG"):
            raise
        if isinstance(exc, HearthError):
            print(f"hearth: error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"  hint: {exc.hint}", file=sys.stderr)
            return exc.exit_code
        raise


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
