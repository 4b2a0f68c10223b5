"""The import contracts, run the way ``lint-imports`` runs them, and module-level cycles.

import-linter's ``acyclic_siblings`` contract finds cycles between the children of a
package. :func:`module_cycles` finds every set of modules that import each other in a
circle, also a package's ``__init__`` and a module inside it, which no sibling
contract sees. Both read a tree of packages under a root directory: the checkout, or
a throwaway tree a test builds to show that a back edge fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

PACKAGES = ("runner", "tools", "hooks", "ops")
_LINT = "from importlinter.cli import lint_imports_command\nlint_imports_command()"
_CYCLES = (
    "import json, sys\n"
    "from tests.support.importgraph import module_cycles\n"
    "print(json.dumps(module_cycles(sys.argv[1:])))"
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root``, with ``root``/pyproject.toml."""
    return subprocess.run(
        [sys.executable, "-c", _LINT, "--no-cache", "--no-logo"],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cycles_under(root: Path, packages: Iterable[str] = PACKAGES) -> list[list[str]]:
    """:func:`module_cycles` of the packages under ``root``, found by a child process:
    a process that has imported the real packages would find them instead of ``root``'s."""
    proc = subprocess.run(
        [sys.executable, "-c", _CYCLES, *packages],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found: list[list[str]] = json.loads(proc.stdout)
    return found


def module_cycles(packages: Iterable[str]) -> list[list[str]]:
    """Each set of modules (two or more, or one importing itself) in an import cycle."""
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None)
    return strongly_connected(sorted(graph.modules), graph.find_modules_directly_imported_by)


def strongly_connected(nodes: list[str], edges: Callable[[str], Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components that are cycles, each sorted, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges(target)))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges(node):
                        cycles.append(sorted(component))
    return sorted(cycles)


def _env() -> dict[str, str]:
    # The child finds the packages in its working directory first (sys.path[0]), and
    # this checkout's tests package (for _CYCLES) after it.
    repo = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": repo}
