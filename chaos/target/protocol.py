"""The checkpointer contract and how a checkpointer is named on the command line.

A checkpointer under test is any class with this shape, constructed once per rank
after the process group is up. Names resolve in three ways: a built-in name
(``reference``, ``dcp``, ``dcp-async``, ``torch-save``), ``pkg.module:Class`` or
``path/to/file.py:Class``. Resolution is split in two so that the parent can reject
a bad name with a clear message without importing torch (``validate_spec``) while
the rank processes do the real import (``load_checkpointer``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from chaos.errors import ConfigError

BUILTIN_CHECKPOINTERS: dict[str, str] = {
    "reference": "chaos.reference.checkpoint.engine:ReferenceCheckpointer",
    "dcp": "chaos.target.adapters.dcp:DCPCheckpointer",
    "dcp-async": "chaos.target.adapters.dcp:AsyncDCPCheckpointer",
    "torch-save": "chaos.target.adapters.torch_save:TorchSaveCheckpointer",
}


@runtime_checkable
class Checkpointer(Protocol):
    """What the harness calls. ``save`` and ``load_latest`` are collective."""

    def save(self, step: int, state: dict) -> None: ...

    def wait(self) -> None: ...

    def load_latest(self, template: dict) -> tuple[int, dict] | None: ...

    def close(self) -> None: ...


def auxiliary_files(checkpointer: Any) -> list[str]:
    """Globs (relative to the root) of files a checkpointer writes *beside* its checkpoints.

    A checkpointer may declare ``auxiliary_files`` (a class attribute): metrics, logs,
    anything no load reads. A failure writing them does not make a save unacknowledgeable,
    so ``no_false_ack`` does not count it as an injury of the save; everything else under
    the root is checkpoint data, judged strictly.
    """
    globs = getattr(checkpointer, "auxiliary_files", ()) or ()
    if isinstance(globs, str) or not all(isinstance(g, str) for g in globs):
        raise ConfigError(f"{type(checkpointer).__name__}.auxiliary_files must be a sequence of glob strings, "
                          f"got {globs!r}")
    return list(globs)


def _split(spec: str) -> tuple[str, str]:
    target = BUILTIN_CHECKPOINTERS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_CHECKPOINTERS))
        raise ConfigError(
            f"unknown checkpointer {spec!r}: use one of {known}, "
            "pkg.module:Class or path/to/file.py:Class"
        )
    where, _, cls = target.rpartition(":")
    if not where or not cls.isidentifier():
        raise ConfigError(f"malformed checkpointer spec {spec!r}: expected MODULE:Class or FILE.py:Class")
    return where, cls


def _is_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or where.startswith(".")


def validate_spec(spec: str) -> str:
    """Check that ``spec`` names an existing class without importing it.

    Returns the spec with any file path made absolute, so rank processes started
    from another working directory resolve the same file.
    """
    where, cls = _split(spec)
    if _is_path(where):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"checkpointer file not found: {where}")
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError as exc:
            raise ConfigError(f"checkpointer file {where} does not parse: line {exc.lineno}: {exc.msg}") from None
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        names |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if cls not in names:
            raise ConfigError(f"checkpointer file {where} defines no class {cls!r}")
        return f"{path}:{cls}"
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(f"checkpointer module not found: {where!r} (from {spec!r})")
    return spec


def load_checkpointer(spec: str) -> type:
    """Import and return the checkpointer class named by ``spec``."""
    where, cls = _split(spec)
    if _is_path(where):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"checkpointer file not found: {where}")
        mod_name = f"chaos_user_checkpointer_{abs(hash(str(path)))}"
        module = sys.modules.get(mod_name)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(mod_name, path)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[mod_name] = module
            file_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigError(f"cannot import checkpointer module {where!r}: {exc}") from None
    try:
        klass: Any = getattr(module, cls)
    except AttributeError:
        raise ConfigError(f"checkpointer module {where!r} has no attribute {cls!r}") from None
    missing = [m for m in ("save", "wait", "load_latest", "close") if not callable(getattr(klass, m, None))]
    if missing:
        raise ConfigError(f"checkpointer {spec!r} lacks method(s): {', '.join(missing)}")
    return klass
