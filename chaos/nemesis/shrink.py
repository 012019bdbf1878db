"""A rank lost for good: a kill with ``lost=true``, after which the job restarts on one rank fewer.

Why: an elastic job (torchelastic with ``--nnodes MIN:MAX``, a scheduler with no spare node)
resumes on the ranks that are left, so its checkpointer must load onto N-1 ranks what N
saved. This is the built-in workload's ``kill:rank=R,step=S,lost=true`` for any job started
with ``--ranks N`` (``rankR:stepS:kill,lost=true`` is the same point):

- attempt 0 runs N copies and rank R is SIGKILLed at step S (or at a ``phase=`` of that step's
  save); the others are stopped as after any kill;
- once that kill fired, every restart runs N-1 copies with ranks 0..N-2 (``RANK``,
  ``WORLD_SIZE``): the ranks above R are numbered down by one, as a new rendezvous numbers them;
- what the restart must reproduce is the same job shrunk after a *clean* stop: the fault-free
  run whose last rank is lost for good as it announces step K+1, where K is the step the
  point's restart resumed at (:func:`reference_point`). Its result files and the losses of its
  restart are what the point's are compared with (``chaos.judge.job``).

Only the harness's own launcher restarts on fewer ranks: a torchrun COMMAND, ``--nodes``,
``--launcher docker`` or ``sbatch`` and a point with a second fault are refused (:func:`refusal`).

Called by ``chaos.cli.job`` (:func:`refusal`, before any run), ``chaos.run.explore`` (the
restarts' job, :func:`restart_job`; the fault-free resize, :func:`reference_point`) and
``chaos.judge.job`` (:func:`lost_rank`, :func:`new_rank`). ``--executor slurm`` is refused by
``chaos.cli.job`` itself: the fault-free resize runs in the exploring process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.model.grammar import parse_point
from chaos.model.jobspec import JobSpec, Point

Traces = dict[tuple[int, int], list[dict[str, Any]]]


def refusal(job: JobSpec, point: Point) -> str | None:
    """Why ``point``, a kill with ``lost=true``, cannot run on ``job`` (None: it can, or it is no such kill)."""
    if not point.lost:
        return None
    if job.torchrun or job.nodes is not None:
        return "lost=true restarts the job on fewer ranks with the harness's own launcher; a torchrun agent " \
               "decides its world size itself (run the training script with --ranks N instead)"
    if job.launcher != "subprocess":
        return f"lost=true is made by the subprocess launcher, not --launcher {job.launcher}"
    if job.ranks is None or job.ranks < 2:
        return "lost=true needs --ranks 2 or more: a rank must remain"
    if point.then is not None:
        return "lost=true takes no second fault (+rankR:opN:MODE)"
    return None


def lost_rank(point: Point, traces: Traces) -> int | None:
    """The rank ``point`` took out for good: its rank, once its kill fired in attempt 0 (else None)."""
    if not point.lost:
        return None
    fired = any(r.get("event") == "fired" for r in traces.get((point.rank, 0), []))
    return point.rank if fired else None


def restart_job(job: JobSpec, point: Point, traces: Traces) -> JobSpec:
    """``job`` as its restarts run after ``point``: one rank fewer once a ``lost=true`` kill fired."""
    if lost_rank(point, traces) is None or job.ranks is None:
        return job
    return dataclasses.replace(job, ranks=job.ranks - 1)


def new_rank(rank: int, lost: int) -> int | None:
    """What attempt 0's rank ``rank`` is numbered in the restarts, rank ``lost`` gone (ranks above it move
    down; the lost one has no number: None)."""
    return None if rank == lost else rank if rank < lost else rank - 1


def reference_point(job: JobSpec, resumed: int) -> Point:
    """The fault-free resize from the checkpoint of step ``resumed``: the last rank lost for good as it
    announces step ``resumed + 1``, after that save returned and before the next one began."""
    assert job.ranks is not None
    return parse_point(f"rank{job.ranks - 1}:step{resumed + 1}:kill,lost=true")


__all__ = ["lost_rank", "new_rank", "reference_point", "refusal", "restart_job"]
