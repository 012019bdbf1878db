"""Typed errors of the reference checkpointer.

Every failure a user can meet names *what* (the checkpoint step or file) and *why*, so a
rejected checkpoint or an aborted save can be acted on without reading a traceback.
All derive from :class:`CheckpointError`, itself a :class:`chaos.errors.ChaosError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.errors import ChaosError, ConfigError


class CheckpointError(ChaosError):
    """Base of every error the reference checkpointer raises on purpose."""


class CheckpointConfigError(ConfigError, TypeError):
    """A bad option (unknown name, wrong type or value).

    Also a ``TypeError`` because an unknown keyword argument is one in Python terms.
    """


class UnsupportedValueError(CheckpointError):
    """The state holds a value the format cannot store without pickle."""


class ManifestError(CheckpointError):
    """A manifest, pointer or shard header is malformed or hostile."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


class CorruptCheckpointError(CheckpointError):
    """Bytes on disk disagree with what the manifest promises (size, checksum, step)."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


class IncompatibleCheckpointError(CheckpointError):
    """A well-formed checkpoint whose structure does not fit the template."""


class CommitError(CheckpointError):
    """A save did not commit; the previous checkpoint stays latest."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist but every one was rejected; ``rejected`` says why for each."""

    def __init__(self, root: str, rejected: Sequence[tuple[int, str]]) -> None:
        self.root = root
        self.rejected = list(rejected)
        lines = "\n".join(f"  step {step}: {why}" for step, why in self.rejected)
        super().__init__(f"no valid checkpoint under {root}; rejected:\n{lines}")
