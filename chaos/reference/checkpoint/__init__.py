"""The reference checkpointer: safetensors shards + manifest, two-phase commit, verified load.

Modules, one job each: ``engine`` (the class), ``saver`` (save pipeline), ``planner``
(who writes what), ``loader`` (verified load with fallback), ``reshard`` (sharded
tensors: ranged, verified reads at any world size), ``async_writer``, ``policy``
(retention, Young/Daly cadence), ``metrics`` (events, Prometheus, alerts), ``comm`` (JSON
over a private gloo group). The format itself (errors, hashing, tree, manifest, shard,
POSIX commit) is :mod:`chaos.reference.ckptformat`, below this package and ``chaos.reference.storage``.
"""

from chaos.reference.checkpoint.engine import ReferenceCheckpointer
from chaos.reference.ckptformat.errors import (
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
