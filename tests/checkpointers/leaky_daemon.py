"""A known-bad checkpointer for the hygiene oracle: it leaves a process behind.

``careful.py``, plus an "upload daemon" that rank 0 starts in a session of its own
(``start_new_session``), so killing the rank's process group does not reach it and
nothing ever stops it: the kind of helper that keeps a node busy after a job is gone.
The hygiene oracle must find it (it inherits the rank's ``CHAOS_SCENARIO`` mark) and
fail the scenario; the runner then kills it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from chaos.target.protocol import load_checkpointer

Careful = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


class LeakyDaemonCheckpointer(Careful):
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 1) -> None:
        super().__init__(root, rank, world_size, keep_last)
        if rank == 0:
            self.daemon = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
