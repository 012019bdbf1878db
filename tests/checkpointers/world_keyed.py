"""A known-bad checkpointer for elastic restarts: checkpoints are keyed by world size.

"One directory per cluster shape, so shards never mix" — ``careful.py`` under
``root/world-<N>/``. Every save is correct and durable, but a job resumed on fewer
ranks looks in ``world-1/``, finds nothing and silently starts over from step 0: the
durability oracle must fail it (resumed older than the newest acknowledged save).
"""

from __future__ import annotations

import os
from pathlib import Path

from chaos.target.protocol import load_checkpointer

Careful = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


class WorldKeyedCheckpointer(Careful):
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 1) -> None:
        super().__init__(os.path.join(root, f"world-{world_size}"), rank, world_size, keep_last)
