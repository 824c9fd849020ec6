"""`hearth ps`: the models that stay loaded after the command that loaded them (like `ollama ps`)."""

from __future__ import annotations

import argparse
import json
import time

NAME = "ps"
HELP = "list the models left loaded by earlier commands (--keep-alive), with their memory and time left"
ORDER = 34
DESCRIPTION = """List the models that stay loaded after `hearth run` or the chat app ended (--keep-alive, default
5m): the next run or chat with the same model and plan uses such a runner at once, without starting an engine.
`hearth stop` ends them.  A running `hearth serve` or chat app holds its own model and is not listed."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def until_text(until: float | None, now: float) -> str:
    if until is None:
        return "until stopped"
    left = max(0.0, until - now)
    if left < 90:
        return f"{left:.0f} seconds from now"
    return f"{left / 60:.0f} minutes from now"


def run(args: argparse.Namespace) -> int:
    import psutil  # lazy: keeps `hearth --help` light

    from app.commands.models import human_bytes  # lazy: keeps `hearth --help` light
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs)
    from backends.runner.resident import resident_dir, residents  # lazy: keeps `hearth --help` light

    now = time.time()
    rows = []
    for r in residents(resident_dir(get_paths().data_dir)):
        try:
            rss = psutil.Process(r.pid).memory_info().rss if r.pid else None
        except psutil.Error:
            continue  # gone since it was listed
        rows.append((r, rss))
    if args.json:
        for r, rss in rows:
            print(
                json.dumps({"model": r.model, "backend": r.backend, "pid": r.pid, "rss_bytes": rss, "until": r.until})
            )
        return 0
    if not rows:
        print("no model is left loaded (hearth run and the chat app keep theirs for --keep-alive, default 5m)")
        return 0
    table = [("MODEL", "BACKEND", "PID", "MEMORY", "UNTIL")]
    for r, rss in rows:
        table.append((r.model, r.backend, str(r.pid), human_bytes(rss) if rss else "?", until_text(r.until, now)))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0
