"""Run the workload under a plain launcher (``torchrun``), for side-by-side launch timing.

``torchrun --nproc-per-node 2 -m chaos.target.workload.standalone LOG_DIR [STEPS]`` pays the
full cost the warm fork server avoids: a fresh interpreter and torch import per rank.
"""

from __future__ import annotations

import os
import sys

from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.spec import RankSpec


def main() -> None:
    from chaos.target.workload.train import rank_entry

    log_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else WorkloadConfig().steps
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun hosts the store itself on MASTER_PORT; the workload's store goes one port up.
    spec = RankSpec(rank=rank, world_size=world, attempt=0, master_addr=os.environ["MASTER_ADDR"],
                    master_port=int(os.environ["MASTER_PORT"]) + 1,
                    workload=WorkloadConfig(steps=steps).to_dict(), log_path=os.path.join(log_dir, f"rank{rank}.jsonl"))
    rank_entry(spec, None)


if __name__ == "__main__":
    main()
