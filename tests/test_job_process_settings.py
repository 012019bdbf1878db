"""A built-in step kill, SIGTERM or hang with its own settings as a user's job's point: a SIGTERM's
``grace=S`` and a ``linger=S`` (the other copies run on for up to S seconds once the struck one is
gone, as a launcher's monitor interval lets them), so the default campaign's
``term:rank=0,step=5,grace=2`` and ``kill:rank=1,phase=save,step=10,linger=3`` run through the
job pipeline (issue #28). A kill's ``lost=true`` (the restarts on one rank fewer) has its own
tests: ``test_job_shrink``.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
from jobcli import CAREFUL, EAGER, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_point


def test_a_grace_or_a_linger_reads_in_both_spellings_and_keeps_the_fault_as_written() -> None:
    term = parse_point("term:rank=0,step=5,grace=2")
    assert term == parse_point("rank0:step5:term,grace=2") and term.id == "rank0:step5:term,grace=2"
    assert (term.family, term.step, term.grace_s, term.linger_s) == ("term", 5, 2.0, 0.0)
    kill = parse_point("kill:rank=1,phase=save,step=10,linger=3")
    assert (kill.id, kill.phase, kill.linger_s, kill.grace_s) == ("rank1:step10:kill,linger=3,phase=save", "save", 3.0, None)
    for point in (term, kill):
        assert parse_point(point.id) == point
    assert term.to_fault()["params"]["grace"] == 2 and kill.to_fault()["params"]["linger"] == 3
    plain = parse_point("kill:rank=0,step=5")  # without settings: the job's own id, as before
    assert (plain.id, plain.builtin, plain.settings) == ("rank0:step5:kill", None, ())
    assert parse_point("rank1:step23:kill,phase=vote").id == "rank1:step23:kill,phase=vote"


@pytest.mark.parametrize(("text", "says"), [
    ("term:rank=0,step=5,lost=true", "not 'lost'"),
    ("rank0:step5:kill,lost=yes", "lost must be true or false"),
    ("term:rank=0,step=5,phase=vote", "with at most grace, linger"),
    ("rank0:step5:term,grace=-1", "grace must be a number of seconds"),
    ("rank0:step5:kill,grace=2", "not 'grace'"),
])
def test_a_setting_a_job_cannot_honour_is_refused(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_point(text)


def test_a_sigterm_s_own_grace_replaces_the_job_s(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--point", "term:rank=0,step=5,grace=0.001", "--point", "rank0:step5:term",
                         "--result-file", "final.json", "--", sys.executable, str(CAREFUL), "--out", "{out}")
    got = {s["id"]: s for s in doc["scenarios"]}
    short = got["rank0:step5:term,grace=0.001"]
    assert "still running after the 0.001 s grace, SIGKILLed" in short["summary"], short["summary"]
    assert short["faults"][0]["params"]["grace_s"] == 0.001
    assert "within the 5 s grace" in got["rank0:step5:term"]["summary"]  # the job's --grace, 5 s by default


def test_a_linger_lets_the_other_rank_commit_what_a_kill_left_torn(tmp_path: Path) -> None:
    """Rank 1 killed halfway through its shard: at once the launcher stops rank 0 before it commits
    (pass); lingering 3 s, rank 0 commits the torn shard and the restart fails on it."""
    script = tmp_path / "eager.py"
    script.write_text(textwrap.dedent(EAGER))
    proc, doc = run_json(tmp_path, "--ranks", "2", "--result-file", "final-*.json", "--point",
                         "kill:rank=1,step=6,phase=shard_half,linger=3", "--point", "rank1:step6:kill,phase=shard_half",
                         "--", sys.executable, str(script), "{out}")
    got = {s["id"]: s for s in doc["scenarios"]}
    lingered = got["rank1:step6:kill,linger=3,phase=shard_half"]
    assert lingered["outcome"] == "hard_failure", lingered["summary"]
    assert lingered["summary"].startswith("the resume copy 1 exited 1"), lingered["summary"]  # a plain kill's line
    assert "ran on for up to 3 s first" in str(lingered["attempts"][0]["outcome"])
    assert lingered["attempts"][0]["lingered_s"] == 3
    at_once = got["rank1:step6:kill,phase=shard_half"]
    assert (at_once["verdict"], at_once["outcome"]) == ("pass", "pass"), at_once["summary"]
