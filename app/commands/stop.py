"""`hearth stop [MODEL]`: unload models left loaded by earlier commands (like `ollama stop`)."""

from __future__ import annotations

import argparse
import sys

NAME = "stop"
HELP = "unload a model left loaded by an earlier command (all of them when no MODEL is given)"
ORDER = 35
DESCRIPTION = """Unload the models `hearth ps` lists: their runners exit and their memory goes back to the system.
MODEL is a registered name or a path; without it every listed model is unloaded."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL", help="registered name or path (default: all)")


def run(args: argparse.Namespace) -> int:
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs)
    from backends.runner.resident import evict, model_tag, resident_dir, residents  # lazy: keeps `hearth --help` light

    found = residents(resident_dir(get_paths().data_dir))
    if args.model is not None:
        tags = set()
        try:
            from app.store import ModelStore  # lazy: keeps `hearth --help` light

            _, spec = ModelStore().spec(args.model)
            tags.add(model_tag(spec.path))
        except Exception:  # noqa: BLE001 - a name that no longer resolves may still match a listed model
            pass
        found = [r for r in found if r.model == args.model or r.model_tag in tags]
        if not found:
            print(f"hearth: {args.model} is not loaded (`hearth ps` lists what is)", file=sys.stderr)
            return 1
    stopped = [r for r in found if evict(r)]
    for r in stopped:
        print(f"stopped {r.model} ({r.backend}, pid {r.pid})")
    if not stopped and args.model is None:
        print("no model was left loaded")
    return 0
