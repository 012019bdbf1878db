"""Named phases of a save: the name checkpointers import (``from chaos.phases import phase``).

A checkpointer calls ``phase("write_shards", step=10)`` as it enters each stage of a save
or load, so fault injectors can fire at "phase X of the save at step N" and the run record
can draw save phases on a timeline. The bus lives in ``faults.phases`` (below the harness,
where the interposer subscribes to it); this module is its public face.
"""

from __future__ import annotations

from faults.phases import phase, subscribe, unsubscribe

__all__ = ["phase", "subscribe", "unsubscribe"]
