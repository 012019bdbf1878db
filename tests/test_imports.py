"""The pipeline's shape, checked: the import-linter contracts hold, no import cycle, a small root.

The contracts in ``pyproject.toml`` (``[tool.importlinter]``) say that each stage of
``chaos`` imports only the stages below it (cli, bench | certify, run, judge, record,
plan : nemesis : launch, target, model), that the reference checkpointer imports nothing of
the harness (and inside it, the engine sits above its storage backends, both above the
on-disk format), and that ``chaos`` sits above ``reports``, which sits above ``faults``. A
cycle between two modules is a tangle no layer rule names, so it is checked apart, on
grimp's import graph (the one import-linter builds), type-checking imports left out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
ROOT_MODULES_AT_MOST = 8


def test_the_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "4 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_a_lazy_import_counts_for_the_contracts() -> None:
    """An import inside a function is an import: grimp counts it, so a lazy import hides no layering breach."""
    graph = grimp.build_graph("chaos", exclude_type_checking_imports=True)
    # chaos.run.runner imports chaos.record.points only inside a function (which faults fired)
    assert "from chaos.record.points import" not in (REPO / "chaos/run/runner.py").read_text().split("\ndef ")[0]
    assert graph.direct_import_exists(importer="chaos.run.runner", imported="chaos.record.points")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_chaos_faults_or_reports_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("chaos", "faults", "reports", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c", "d"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert _cycles(graph) == [["a", "b", "c"]]


def test_chaos_keeps_at_most_eight_modules_at_its_root() -> None:
    """The folders show the stages; the root holds only what every stage shares."""
    root = sorted(p.name for p in (REPO / "chaos").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= ROOT_MODULES_AT_MOST, root
