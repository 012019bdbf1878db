"""Typed errors of the harness.

``ChaosError`` and ``ConfigError`` are defined in ``faults.errors`` (the bottom of the
dependency order, so fault primitives and reports raise them without importing the
harness) and re-exported here. The CLI maps ConfigError to exit status 2 with its one-line message; anything else
that escapes a scenario is a harness error (also exit 2) and is reported as such,
never as a verdict on the checkpointer.
"""

from __future__ import annotations

from faults.errors import ChaosError, ConfigError

__all__ = ["ChaosError", "ConfigError", "HarnessError"]


class HarnessError(ChaosError):
    """The harness itself failed (could not launch ranks, lost its records)."""
