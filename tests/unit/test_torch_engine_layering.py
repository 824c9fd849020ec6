"""The torch engine's modules import each other in one direction only (issue 15 item 7): no cycle, counting
imports inside functions too (a lazy import is still an arrow).  The one arrow from the engine half to the model
half is backend.py's lazy `build_parts` (into build.py, the model half's entry point); what both halves share
lives in parts.py, below both.  The whole tree's cycles: scripts/import_cycles.py (tests/unit/test_import_contracts)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "backends" / "torch_engine"
PREFIX = "backends.torch_engine."


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        name = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
                deps.add(node.module.removeprefix(PREFIX).split(".")[0])
            elif isinstance(node, ast.Import):
                deps |= {a.name.removeprefix(PREFIX).split(".")[0] for a in node.names if a.name.startswith(PREFIX)}
        graph[name] = deps - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path + [n, d]
            if d not in state and (found := visit(d, path + [n])):
                return found
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n, [])):
            return found
    return None


def test_no_import_cycle_in_the_torch_engine() -> None:
    graph = _imports()
    assert "build" in graph["backend"] and "backend" not in graph["build"]
    assert "model_runner" in graph["build"] and "backend" not in graph["model_runner"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_pure_python_half_imports_no_torch() -> None:
    for name in ("scheduler", "block_manager", "request", "seams", "parts", "messages"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in mods if m == "torch" or m.startswith("torch.")}, name
