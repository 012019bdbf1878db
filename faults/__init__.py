"""Fault injectors: the nemeses of the chaos harness.

Each module does one job and speaks plain data: a rule or plan (a dataclass) goes in,
a JSON-serialisable record of exactly what was done comes out, so the run record,
the oracles and ``chaos replay`` all read the same description of a fault.

    interposer   in-rank I/O tracing and fault actions at the Nth op, byte X, or a phase
    shim         the native tracer (chaosio.c, LD_PRELOAD over libc's file calls): built and bound
    crashstate   power-loss states (ALICE / LazyFS model) built from an I/O trace
    corrupt      at-rest corruption of committed files (truncate, bit flips, ...)
    disk         real ENOSPC: private tmpfs mounts and pre-filled file systems
    network      per-rank network namespaces on a veth bridge, link down/up, TCP proxy
    process      signals to process groups, and reaping that leaves nothing behind
    fusemount    a FUSE mount's daemon: found from its mount, killed at a counted request, remounted
    blocklog     a loop device's block writes and flushes, logged through a FUSE file
    blockstates  the crash states a block log allows (everything before the last flush survives)
    errors       the error types of every layer (``chaos.errors`` re-exports them)
    phases       the bus on which a save's named phases are announced (``chaos.phases``)

Importing this package imports none of them: a rank process pays only for what it uses.
"""

from __future__ import annotations

from faults.errors import FaultError, OutsideScratchRoot, Unsupported

__all__ = ["FaultError", "OutsideScratchRoot", "Unsupported"]
