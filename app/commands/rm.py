"""`hearth rm NAME`: forget a model; delete its files only when hearth downloaded them."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from app.commands.models import human_bytes
from backends.errors import ModelNotFoundError

NAME = "rm"
HELP = "remove a model: deletes files hearth downloaded, only unregisters files you added"
ORDER = 32
DESCRIPTION = """Remove a model from hearth.  A model fetched with `hearth pull` has its files deleted;
a file registered with `hearth models add` is only forgotten, never deleted.  Asks first unless --yes."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="registered model name (see `hearth models`)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def owned_files(entry: object) -> list[str]:
    """The files `rm` may delete: only those hearth wrote, and only inside hearth's models dir."""
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs, 1 hearth modules)

    if not getattr(entry, "owned", False):
        return []
    root = get_paths().models_dir.resolve()
    return [f for f in entry.files if Path(f).resolve().is_relative_to(root)]  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> int:
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)

    store = ModelStore()
    entry = store.get(args.name)
    if entry is None or entry.source == "builtin":
        store.remove(args.name)  # raises the right error (unknown name / built-in starter)
        raise ModelNotFoundError(f"no model named {args.name!r}")
    shared = {f for e in store.entries() if e.name != entry.name for f in e.files}  # e.g. one repo's config.json
    files = [f for f in owned_files(entry) if Path(f).exists() and f not in shared]
    size = sum(Path(f).stat().st_size for f in files if Path(f).is_file())
    what = (
        f"delete {len(files)} file(s), {human_bytes(size)}"
        if files
        else f"unregister it (its file {entry.path} is kept: hearth did not download it)"
    )
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"hearth: `hearth rm {args.name}` would {what}; pass --yes to confirm", file=sys.stderr)
            return 1
        answer = input(f"remove {args.name}: {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed")
            return 1
    store.remove(args.name)  # unregister first: a crash mid-delete leaves stray files, never a broken entry
    for f in files:
        Path(f).unlink(missing_ok=True)
    _prune_empty(files)
    print(
        f"removed {args.name}" + (f": deleted {len(files)} file(s), {human_bytes(size)}" if files else " (file kept)")
    )
    return 0


def _prune_empty(files: list[str]) -> None:
    """Remove the model folders the deleted files leave empty (hf's .cache metadata included), not above models/."""
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs, 1 hearth modules)

    root = get_paths().models_dir.resolve()
    for folder in {Path(f).resolve().parent for f in files}:
        while folder != root and folder.is_relative_to(root) and folder.exists():
            # hf's .cache metadata and an empty .partial (no unfinished download of the repo) do not keep it
            rest = [
                p
                for p in folder.iterdir()
                if not (p.name == ".cache" or (p.name == ".partial" and not any(p.iterdir())))
            ]
            if rest:
                break
            shutil.rmtree(folder, ignore_errors=True)
            folder = folder.parent
