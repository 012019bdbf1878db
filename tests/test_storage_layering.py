"""Layering: ``chaos.storage`` sits below ``chaos.checkpoint`` and never imports it back.

The checkpoint format both need lives in ``chaos.ckptformat``, which imports neither.
Checked on the source (every import statement, at any depth, including the ones inside
functions), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CHAOS = Path(__file__).resolve().parent.parent / "chaos"


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((CHAOS / package).rglob("*.py"))
    assert files, f"no modules under chaos/{package}"
    return [f"{f.relative_to(CHAOS.parent)}:{line} imports {name}" for f in files for line, name in _imports(f)
            if any(name == p or name.startswith(p + ".") for p in forbidden)]


@pytest.mark.parametrize("package, forbidden", [
    ("storage", ("chaos.checkpoint",)),
    ("ckptformat", ("chaos.checkpoint", "chaos.storage")),
])
def test_lower_packages_never_import_the_higher_ones(package, forbidden):
    assert _violations(package, forbidden) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from chaos.checkpoint import commit\n    import chaos.checkpoint.engine\n")
    assert [n for _, n in _imports(mod)] == ["chaos.checkpoint", "chaos.checkpoint.commit", "chaos.checkpoint.engine"]
