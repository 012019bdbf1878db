"""The error types every layer raises, defined at the bottom of the dependency order.

The fault primitives here and the report renderers (``reports``) raise the harness's own
types without importing the harness: the harness (``chaos``) sits above both and re-exports
:class:`ChaosError` and :class:`ConfigError` from ``chaos.errors``, adding its own
``HarnessError``. The CLI maps a :class:`ConfigError` to exit status 2 with its one-line
message; anything else that escapes a scenario is a harness error (also exit 2), never a
verdict on the checkpointer.
"""

from __future__ import annotations


class ChaosError(Exception):
    """Base of every error the harness raises on purpose."""


class ConfigError(ChaosError):
    """Bad user input: unknown checkpointer, malformed fault, missing file."""


class FaultError(ChaosError):
    """A fault could not be set up, carried out or torn down as asked."""


class OutsideScratchRoot(FaultError, ConfigError):
    """A fault was aimed at a path outside the scenario's scratch root; refused.

    Corruption and disk fillers edit real files, so every entry point checks the
    realpath of its target against the scratch root before touching anything.
    """


class Unsupported(FaultError):
    """This machine cannot provide the mechanism (not root, no namespaces, ...).

    Carries a one-line reason that the harness turns into a *skipped* verdict.
    """
