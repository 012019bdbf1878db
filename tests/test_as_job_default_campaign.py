"""Every scenario of the built-in default campaign runs through the job pipeline (issue #28).

``chaos run --as-job --fault SPEC`` takes each of the nine faults ``chaos.cli.main.default_campaign``
plans (a kill, a SIGTERM with its grace, a crash at a write, a kill at the save's phase with a
linger, a 16-bit flip and a payload in the newest checkpoint, a full disk at a step, a network
cut, the power cuts of a whole save): none is refused, each is judged, and the reference
checkpointer passes every one. The power scenario keeps 3 of its cuts here (``max_states=3``;
the campaign's 60 take about four minutes on 2 cores). Slow: about a minute and a half.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jobcli import run_json

from chaos.cli.main import default_campaign
from chaos.model.grammar import parse_point
from chaos.target.workload.config import WorkloadConfig


@pytest.mark.slow
def test_the_default_campaign_runs_through_the_job_pipeline(tmp_path: Path) -> None:
    specs = [re.sub(r"max_states=\d+", "max_states=3", s[0]) for s in default_campaign(WorkloadConfig(), 2)]
    assert len(specs) == 9
    proc, doc = run_json(tmp_path, "--as-job", *(a for s in specs for a in ("--fault", s)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = doc["scenarios"]
    power = [r for r in results if parse_point(r["id"]).family == "power"]
    assert len(power) == 3  # the whole save's stand-in, three of its cuts
    assert len(results) == 8 + 3
    for result in results:
        skipped_why = result["outcome"] in ("no_effect", "unsupported") and result["verdict"] == "skipped"
        assert result["verdict"] == "pass" or skipped_why, (result["id"], result["outcome"], result["summary"])
    passed = {parse_point(r["id"]).mode for r in results if r["verdict"] == "pass"}
    assert {"kill", "term", "crash", "bitflip"} <= passed
