"""Fail (exit 1) when an import inside a function or method says not why it is there.

Issue 23's rule: imports sit at module level, except a heavy third-party library (torch, triton, llama_cpp,
textual, fastapi, ...) or a measured start-up cost (`hearth --help` imports every command module), and each such
import carries a comment saying which, on its own line or in the comment lines right above it:

    def load(self) -> None:
        import torch  # lazy: torch (about 1-3 s), loaded only in the runner

        # lazy: keeps `hearth --help` light (+psutil)
        from app.loading import open_backend

A lazy import is never the way to break an import cycle: scripts/import_cycles.py counts imports inside
functions too, so the mend is a small module holding what both sides need.  Run by `scripts/dev test` next to
import_cycles.py (and by tests/unit/test_import_contracts.py).

    python scripts/lazy_imports.py [PATH ...]     default: app backends hwprobe kernels
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "backends", "hwprobe", "kernels")
MARKER = re.compile(r"#\s*lazy:\s*\S")  # `# lazy: <reason>`, the reason not empty


def _function_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement inside a function or method (nested ones too), in line order."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [sub for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))]
    seen: set[int] = set()  # a nested function's imports are walked from each enclosing function
    for node in sorted(found, key=lambda n: (n.lineno, n.col_offset)):
        if id(node) not in seen:
            seen.add(id(node))
            yield node


def bare_lazy_imports(source: str) -> list[tuple[int, str]]:
    """(line, statement's first line) of each function-level import without a `# lazy:` reason on its first
    line or in the comment lines right above it."""
    lines = source.splitlines()
    bare = []
    for node in _function_imports(ast.parse(source)):
        first = lines[node.lineno - 1]
        comments = []  # the comment lines right above the import (a reason may take more than one line)
        at = node.lineno - 2
        while at >= 0 and lines[at].strip().startswith("#"):
            comments.append(lines[at])
            at -= 1
        if MARKER.search(first) or any(MARKER.search(c) for c in comments):
            continue
        bare.append((node.lineno, first.strip()))
    return bare


def _files(paths: list[str]) -> Iterator[Path]:
    for name in paths:
        path = Path(name)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            yield path


def main(argv: list[str]) -> int:
    paths = argv or [str(ROOT / pkg) for pkg in PACKAGES]
    count = 0
    for path in _files(paths):
        for lineno, text in bare_lazy_imports(path.read_text(encoding="utf-8")):
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(f"{shown}:{lineno}: {text}")
            count += 1
    if count:
        print(
            f"{count} import(s) inside functions without a reason: move each to the top of its module, or say "
            "which heavy library or start-up cost keeps it there (`# lazy: <reason>`, same line or comment above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
