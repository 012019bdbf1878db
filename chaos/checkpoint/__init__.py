"""The reference checkpointer: safetensors shards + manifest, two-phase commit, verified load.

Modules, one job each: ``engine`` (the class), ``saver`` (save pipeline), ``commit``
(POSIX two-phase commit), ``manifest`` and ``tree`` (format, hostile-input checks),
``shard`` (safetensors I/O), ``planner`` (who writes what), ``loader`` (verified load
with fallback), ``async_writer``, ``policy`` (retention, Young/Daly cadence), ``metrics``
(events, Prometheus, alerts), ``comm`` (JSON over a private gloo group).
"""

from chaos.checkpoint.engine import ReferenceCheckpointer
from chaos.checkpoint.errors import (
    CheckpointConfigError,
    CheckpointError,
    CommitError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    ManifestError,
    NoValidCheckpointError,
    UnsupportedValueError,
)

__all__ = [
    "CheckpointConfigError",
    "CheckpointError",
    "CommitError",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "ManifestError",
    "NoValidCheckpointError",
    "ReferenceCheckpointer",
    "UnsupportedValueError",
]
