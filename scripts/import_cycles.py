"""Fail (exit 1) when any of hearth's modules imports itself back through others: an import cycle.

Run by `scripts/dev test` after `lint-imports` (and by tests/unit/test_import_contracts.py).  The graph is
grimp's (import-linter's own), so imports inside functions count: a lazy import hides a cycle from Python's
import machinery, not from this check.  Imports under `if TYPE_CHECKING:` are left out (they never run).
The usual mend is a small module holding what both sides need (e.g. app/loaded.py, backends/spec_types.py).
Inside backends.torch_engine (PACKAGE_LEVEL) the subpackages count as one node each: tp/ may not import a module
that imports tp/ back, even when no single module closes the loop.

    python scripts/import_cycles.py [PACKAGE ...]     default: app backends hwprobe kernels
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

# hearth's packages from this checkout first: a `kernels` distribution on PyPI (pulled in by the dev tools) would
# otherwise shadow hearth's kernels/ when the script's own folder, not the checkout, leads sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PACKAGES = ("app", "backends", "hwprobe", "kernels")


# packages whose direct children (modules and subpackages) must not form a cycle either, each subpackage taken
# as one node: a subpackage is one idea, so nothing it imports may import it back
PACKAGE_LEVEL = ("backends.torch_engine",)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (each a set of modules on a cycle), sorted;
    a module importing itself counts too."""
    return _components({m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)})


def package_cycles(graph: grimp.ImportGraph, parent: str) -> list[list[str]]:
    """The cycles between `parent`'s direct children, each subpackage squashed into one node (tp/layers.py and
    tp/group.py are both `parent.tp`); imports inside one child do not count."""

    def child(module: str) -> str | None:
        if not module.startswith(parent + "."):
            return None
        return parent + "." + module[len(parent) + 1 :].split(".")[0]

    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        source = child(module)
        if source is None:
            continue
        targets = edges.setdefault(source, set())
        for imported in graph.find_modules_directly_imported_by(module):
            target = child(imported)
            if target is not None and target != source:
                targets.add(target)
    return _components({m: sorted(t) for m, t in sorted(edges.items())})


def _components(edges: dict[str, list[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in edges:  # Tarjan's algorithm, iterative (the graph is deep enough to hit the recursion limit)
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, [])
            if i < len(targets):
                work.append((node, i + 1))
                nxt = targets[i]
                if nxt not in edges:
                    continue
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(cycles)


def _describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    first = component[0]
    # one concrete loop through the component's first module: a step out, then the shortest way back
    for nxt in sorted(graph.find_modules_directly_imported_by(first)):
        if nxt in component:
            back = graph.find_shortest_chain(importer=nxt, imported=first) if nxt != first else (first,)
            if back:
                return " -> ".join((first, *back))
    return ", ".join(component)


def main(argv: list[str]) -> int:
    packages = argv or list(PACKAGES)
    graph = grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)
    cycles = import_cycles(graph)
    for component in cycles:
        print(f"import cycle: {_describe(graph, component)}")
    for parent in PACKAGE_LEVEL:
        if parent.split(".")[0] not in packages:
            continue
        for component in package_cycles(graph, parent):
            print(f"package cycle inside {parent}: {', '.join(component)} (each imports the others, via submodules)")
            cycles.append(component)
    if cycles:
        print(
            f"{len(cycles)} import cycle(s) between hearth's modules or packages: move what both sides need into a "
            "small module of its own (imports inside functions count too)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
