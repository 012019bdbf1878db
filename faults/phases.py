"""Named phases of a save, announced by checkpointers that know them.

A checkpointer calls ``phase("write_shards", step=10)`` as it enters each stage of a
save or load. Fault injectors subscribe (inside the rank process) to fire exactly at
"phase X of the save at step N", and the run record uses the same announcements to
draw save phases on a timeline. With no listener a phase costs one list check.

Checkpointers import it as ``chaos.phases`` (the public name, which re-exports this
module's functions); the bus itself lives here, at the bottom, so that the interposer
(``faults.interposer``) subscribes without importing the harness.
"""

from __future__ import annotations

# Imported as every traced rank of a job starts (through faults.interposer): no ``typing``
# at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Listener = Callable[[str, dict[str, Any]], None]

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def phase(name: str, /, **info: Any) -> None:
    """Announce that the calling rank enters phase ``name`` (with context such as step)."""
    for listener in list(_listeners):
        listener(name, info)
