"""Hypothesis strategies for fault schedules, composed from one small strategy per family.

A schedule is a list of fault specs (the same strings ``--fault`` takes), so a failing
example prints as a ready replay command and shrinks towards fewer, earlier, simpler
faults. The second fault of a schedule fires in the restart the first one caused
(``attempt=1``): restarts during restarts.
"""

from __future__ import annotations

from hypothesis import strategies as st

from chaos.workload.config import WorkloadConfig

REFERENCE_PHASES = ("save", "write_shards", "fsync_shards", "vote", "write_manifest", "rename", "update_latest")


def fault_schedules(cfg: WorkloadConfig, world_size: int, *, max_faults: int = 2,
                    phases: tuple[str, ...] = ("save",)) -> st.SearchStrategy[list[str]]:
    saves = cfg.save_steps() or [cfg.steps]
    ranks = st.integers(0, world_size - 1)
    any_step = st.integers(2, cfg.steps)
    save_step = st.sampled_from(saves)
    process = st.builds(lambda kind, rank, step: f"{kind}:rank={rank},step={step}",
                        st.sampled_from(["kill", "term"]), ranks, any_step)
    at_phase = st.builds(lambda rank, step, phase: f"kill:rank={rank},phase={phase},step={step}",
                         ranks, save_step, st.sampled_from(phases))
    io = st.builds(lambda kind, rank, step, op, nth: f"{kind}:rank={rank},step={step},op={op},nth={nth}",
                   st.sampled_from(["crash", "eio", "enospc"]), ranks, save_step,
                   st.sampled_from(["write", "fsync", "rename"]), st.integers(1, 3))
    rest = st.builds(lambda kind, step, seed: f"{kind}:step={step},seed={seed}",
                     st.sampled_from(["bitflip", "truncate", "delete"]),
                     st.integers(min(saves[0] + 1, cfg.steps), cfg.steps), st.integers(0, 2**16))
    one = st.one_of(process, at_phase, io, rest)
    return st.lists(one, min_size=1, max_size=max_faults).map(
        lambda faults: [f if i == 0 else f"{f},attempt={i}" for i, f in enumerate(faults)])
