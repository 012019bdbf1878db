"""The job's own script: which local ``.py`` file COMMAND runs, what it imports, at which versions.

Facts about the target, read without running it: ``chaos.run.results`` records the
versions of the third-party packages the script imports (``environment.packages``), and
``chaos repro`` (``chaos.cli.repro``) copies the script beside its reproduction and
names the same versions in its issue draft.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from chaos.model.jobspec import JobSpec

FRAMEWORKS = ("transformers", "lightning", "pytorch-lightning", "accelerate", "torchdata")  # stand-ins when COMMAND has no script to read


@dataclass(frozen=True)
class JobScript:
    """The job's one local ``.py`` file: where in COMMAND it is, and where it is on disk."""

    index: int
    path: Path


def job_script(spec: JobSpec) -> JobScript | None:
    """The single ``.py`` argument of COMMAND that exists (relative to the recorded cwd), else None
    (no script, several, or gone). ``chaos repro`` copies it beside the repro script."""
    found = []
    for i, arg in enumerate(spec.command):
        if arg.endswith(".py") and "{out}" not in arg:
            p = Path(spec.cwd, arg)
            if p.is_file():
                found.append(JobScript(i, p.resolve()))
    return found[0] if len(found) == 1 else None


def job_imports(path: Path) -> list[str]:
    """Top-level modules a Python file imports (absolute imports only), in order of first appearance."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            mods = [node.module]
        else:
            continue
        for m in mods:
            top = m.split(".")[0]
            if top not in names:
                names.append(top)
    return names


def installed(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _distributions() -> dict[str, list[str]]:
    """Top-level module -> the distributions that provide it (a scan of every installed one: once a process)."""
    return dict(metadata.packages_distributions())


@functools.lru_cache(maxsize=16)
def script_packages(path: str) -> dict[str, str]:
    """Installed distribution -> version for the third-party modules the script at ``path`` imports,
    in import order; the standard library and the harness left out.

    Read by ``chaos.cli.repro.versions`` (the issue draft) and ``chaos.run.results.job_packages``
    (the results' ``environment.packages``). Most distributions are named as their module (torch,
    transformers, lightning): the scan of every installed one (~75 ms) only for the others.
    """
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    out: dict[str, str] = {}
    for mod in job_imports(Path(path)):
        if mod in stdlib or mod == "chaos":
            continue
        for dist in [mod] if installed(mod) else _distributions().get(mod, []):
            if dist not in out and (v := installed(dist)):
                out[dist] = v
    return out
