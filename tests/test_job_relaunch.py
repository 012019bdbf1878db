"""Who restarts a job after a point: the harness, or torchrun's own agent (``explore._restarts``).

Pure: a stand-in for a run chain records the attempts the harness would launch, each
failing or succeeding as told, so the rule is checked for every family without
starting a process. The real launches are in ``tests/test_job_torchrun.py`` and the
slow ``tests/test_job_faults_torchrun.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from chaos.launch.job import AttemptOutcome
from chaos.model.jobspec import JobSpec, parse_point
from chaos.run import explore

TORCHRUN = JobSpec(command=("torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "t.py", "--out", "{out}"),
                   max_restarts=2)
PLAIN = JobSpec(command=("python", "t.py", "--out", "{out}"), ranks=2, max_restarts=2)


class Chain(explore.Run):
    """Attempt 0 ended as ``first``; every later attempt ends as the next of ``then``."""

    def __init__(self, first: int, then: list[int]) -> None:
        super().__init__("/nowhere", "/nowhere/out", "mark")
        self.attempts = [AttemptOutcome(0, [], returncodes=[first])]
        self._then = list(then)

    def attempt(self, job: JobSpec, attempt: int, point: Any) -> AttemptOutcome:
        assert point is None  # a restart is never armed
        out = AttemptOutcome(attempt, [], returncodes=[self._then.pop(0)])
        self.attempts.append(out)
        return out


@pytest.mark.parametrize("point", ["disk:full:16384", "rank0:op7:truncate", "rank0:op7:power", "rank0:step3:term"])
def test_a_torchrun_job_that_gave_up_is_relaunched_after_a_fault_that_stopped_or_outlasted_its_agent(point: str) -> None:
    # a full disk: the agent's own restarts met the same full disk; the relaunch comes once it has room
    chain = Chain(first=1, then=[0])
    explore._restarts(TORCHRUN, chain, parse_point(point))
    assert [a.attempt for a in chain.attempts] == [0, 1]


@pytest.mark.parametrize("point", ["rank0:op7:after", "rank0:op7:enospc", "rank1:step3:kill"])
def test_a_torchrun_job_is_left_to_its_agent_after_an_in_rank_fault(point: str) -> None:
    chain = Chain(first=1, then=[0])
    explore._restarts(TORCHRUN, chain, parse_point(point))
    assert [a.attempt for a in chain.attempts] == [0]  # torchelastic restarted it, or it is down


def test_the_harness_restarts_its_own_copies_until_one_attempt_succeeds_and_no_further() -> None:
    chain = Chain(first=1, then=[1, 0])
    explore._restarts(PLAIN, chain, parse_point("rank0:op7:after"))
    assert [a.attempt for a in chain.attempts] == [0, 1, 2]
    finished = Chain(first=0, then=[])
    explore._restarts(TORCHRUN, finished, parse_point("disk:full:16384"))  # it survived the full disk
    assert [a.attempt for a in finished.attempts] == [0]
