"""Typed errors of the harness.

The CLI maps ConfigError to exit status 2 with its one-line message; anything else
that escapes a scenario is a harness error (also exit 2) and is reported as such,
never as a verdict on the checkpointer.
"""

from __future__ import annotations


class ChaosError(Exception):
    """Base of every error the harness raises on purpose."""


class ConfigError(ChaosError):
    """Bad user input: unknown checkpointer, malformed fault, missing file."""


class HarnessError(ChaosError):
    """The harness itself failed (could not launch ranks, lost its records)."""
