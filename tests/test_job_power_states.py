"""Power loss for a job beyond "every pending change lost": the cut's mixed crash states
(``rankR:opN:power:sK``: some un-fsynced data or directory entries kept, a write torn),
each recovered by the real job and judged."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec, parse_point
from chaos.run import explore

EXAMPLES = Path(__file__).resolve().parents[1] / "chaos" / "examples"


def _job(script: str) -> JobSpec:
    return JobSpec(command=(sys.executable, str(EXAMPLES / script), "--out", "{out}"), faults=("power",))


def test_a_mixed_state_point_round_trips_and_only_power_names_one() -> None:
    p = parse_point("rank0:op9:power:s2")
    assert (p.mode, p.op, p.state, p.family, p.id) == ("power", 9, 2, "power", "rank0:op9:power:s2")
    assert parse_point("rank0:op9:power").state is None
    for bad in ("rank0:op9:after:s1", "rank0:op9:power:s0", "rank0:step3:kill:s1"):
        with pytest.raises(ConfigError, match="malformed --point"):
            parse_point(bad)


def test_mixed_states_find_the_torn_checkpoint_that_everything_lost_hides(tmp_path: Path) -> None:
    """The careless job overwrites ckpt.json in place without fsync. With every pending change
    lost the file is simply gone (lost work); a power cut that keeps part of the write leaves a
    torn JSON, and every restart dies on it."""
    e = explore.explore(_job("careless_job.py"), jobs=1, scratch_base=str(tmp_path))
    worst = Counter(r.verdict.outcome for r in e.results if r.point.state is None)
    mixed = [r for r in e.results if r.point.state is not None]
    assert mixed and {r.point.state for r in mixed} == {1, 2, 3}
    assert "hard_failure" not in worst and worst["lost_work"] > 0
    torn = [r for r in mixed if r.verdict.outcome == "hard_failure"]
    assert torn, Counter(r.verdict.outcome for r in mixed)
    assert any("kept, a write torn" in r.verdict.fault["what"] for r in torn)
    assert any("JSONDecodeError" in r.verdict.summary for r in torn)
    assert all(r.verdict.fault["choice"] == f"mixed state {r.point.state}" for r in mixed)
    # each replays exactly that state, at that event (anchored: the job's paths are the same in every run)
    assert all(r.point.anchored and f"--point {r.point.id}@{r.point.kind}:{r.point.path}:{r.point.nth} " in r.replay
               for r in torn)


def test_the_careful_job_survives_every_mixed_state(tmp_path: Path) -> None:
    e = explore.explore(_job("careful_job.py"), jobs=1, scratch_base=str(tmp_path))
    mixed = [r for r in e.results if r.point.state is not None]
    judged = [r for r in mixed if r.verdict.outcome != "no_effect"]
    assert len(judged) >= 10
    assert {r.verdict.outcome for r in judged} == {"pass"}, [(r.point.id, r.verdict.summary) for r in judged
                                                            if r.verdict.outcome != "pass"]
    # a point naming more states than its cut has is skipped with the reason, never passed
    skipped = [r for r in mixed if r.verdict.outcome == "no_effect"]
    assert all("this point asks for state" in r.verdict.fault["skipped"] for r in skipped)
    assert all(r.verdict.verdict == "skipped" for r in skipped)
