"""Fails when app/, backends/, hwprobe/ or kernels/ grow long functions again (issue 44 item 4): at most
MAX_OVER_60 functions over 60 lines (nested functions count inside their outer one), none over 100.  The ones
over 60 today are Triton kernels and a few loops that read best whole; a new long function should split along
its seams instead (docs/ARCHITECTURE.md, "How we write code")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("app", "backends", "hwprobe", "kernels")
MAX_OVER_60 = 15
LONG, TOO_LONG = 60, 100


def long_functions(root: Path) -> list[tuple[int, str]]:
    rows = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LONG:
                        rows.append((lines, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def main() -> int:
    rows = long_functions(Path(__file__).resolve().parent.parent)
    over = [r for r in rows if r[0] > TOO_LONG]
    if over or len(rows) > MAX_OVER_60:
        for lines, where in rows:
            print(f"{lines:4d} lines  {where}", file=sys.stderr)
        print(
            f"{len(rows)} functions over {LONG} lines (at most {MAX_OVER_60}), {len(over)} over {TOO_LONG} (none "
            "allowed): split the new ones along their seams",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
