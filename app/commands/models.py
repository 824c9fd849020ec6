"""`hearth models`: list local models; `hearth models add PATH [--name NAME]` registers a GGUF without copying."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backends.registry import BACKENDS
from hwprobe.errors import HearthError
from hwprobe.support import torch_engine_refusal

NAME = "models"
HELP = "list local models, or register one with `hearth models add PATH`"
ORDER = 30
DESCRIPTION = """List the models hearth knows: the built-in starter model, files registered with
`hearth models add`, and models downloaded with `hearth pull`.  Metadata is read from each GGUF header
and cached, so listing stays fast.

  hearth models                          table
  hearth models --json                   one JSON object per model in a list
  hearth models add ~/m/foo.Q4_K_M.gguf --name foo

`models add` checks the file as `hearth run` would (types, limits and tensor table of the header: README
"Limits on model files") and registers nothing it refuses."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = p.add_subparsers(dest="models_action", metavar="ACTION")
    add = sub.add_parser("add", help="register a local GGUF file (or HF folder) without copying it")
    add.add_argument("path", metavar="PATH")
    add.add_argument("--name", metavar="NAME", help="name to use (default: the file name, lower-cased)")


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def human_count(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def model_row(entry, spec) -> dict:
    from backends.embeddings import kind, pooling_type  # lazy: keeps `hearth --help` light (+1 hearth modules)

    return {
        "name": entry.name,
        "path": entry.path,
        "source": entry.source,
        "repo": entry.repo,
        "revision": entry.revision,
        "size_bytes": spec.file_size_bytes,
        "architecture": spec.architecture,
        "parameters": spec.param_count,
        "quant": spec.file_type,
        "quant_types": spec.tensor_types,
        "context_length": spec.context_length,
        "format": spec.format,
        "size_on_disk": size_on_disk(entry, spec),
        # "chat" | "embedding" (an encoder such as BERT / nomic-embed / bge, or a file naming its pooling: it
        # makes vectors for /v1/embeddings and /api/embed and is refused for chat)
        "kind": kind(spec),
        "pooling": pooling_type(spec),
        "backends": runnable_backends(spec),
    }


def size_on_disk(entry, spec) -> int:
    """Bytes the model takes: every file hearth wrote for it (all shards), else the file or folder itself."""
    try:
        files = [Path(f) for f in entry.files] if entry.files else []
        if not files:
            p = Path(entry.path)
            files = [f for f in p.rglob("*") if ".cache" not in f.parts] if p.is_dir() else [p]
        return sum(f.stat().st_size for f in files if f.is_file()) or spec.file_size_bytes
    except OSError:  # a folder that became unreadable: the header's figure still says the size
        return spec.file_size_bytes


def runnable_backends(spec) -> list[str]:
    """The installed backends whose capabilities cover this model's format and architecture."""
    out = []
    for name, info in BACKENDS.items():
        caps = info.capabilities
        if not (caps.gguf if spec.format == "gguf" else caps.safetensors):
            continue
        if name == "torch" and torch_engine_refusal(spec.to_shape()):
            continue
        if info.is_installed():
            out.append(name)
    return out


def run(args: argparse.Namespace) -> int:
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)

    store = ModelStore()
    if args.models_action == "add":
        entry, spec = store.add(args.path, args.name)
        print(
            f"registered {entry.name}: {spec.architecture}, {human_count(spec.param_count)} parameters, "
            f"{spec.file_type}, {human_bytes(spec.file_size_bytes)} ({entry.path})"
        )
        return 0
    rows, problems = [], []
    for entry in store.entries():
        try:
            rows.append(model_row(entry, store.spec_for_path(Path(entry.path))))
        except HearthError as exc:
            problems.append(f"{entry.name}: {exc.message}")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        header = ("NAME", "KIND", "SIZE", "ARCH", "PARAMS", "QUANT", "CONTEXT", "SOURCE", "BACKENDS")
        table = [header] + [
            (
                r["name"],
                r["kind"],
                human_bytes(r["size_on_disk"]),
                r["architecture"],
                human_count(r["parameters"]),
                _quant_text(r),
                str(r["context_length"]),
                f"{r['repo']}@{r['revision'][:7]}" if r["repo"] and r["revision"] else (r["repo"] or r["source"]),
                ",".join(r["backends"]) or "-",
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if not rows:
            print("(no models: `hearth models add PATH` or `hearth pull REPO_ID`)")
    for p in problems:
        print(f"hearth: warning: {p}", file=sys.stderr)
    return 0


def _quant_text(row: dict) -> str:
    others = sorted(t for t in row["quant_types"] if t not in (row["quant"], "F32"))
    return row["quant"] + (f" (+{','.join(others)})" if others else "")
