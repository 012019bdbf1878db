"""The shipped example jobs through the pytest face: ``chaos.job(COMMAND)`` then ``chaos.check``.

What a team writes over its own ``train.py`` (``pytest suites/ -m chaos``), here over
the two pure-Python examples in ``chaos/examples/``:

- ``careful_job.py`` (temp file, fsync, rename, directory fsync), two ranks with
  torchrun's environment: every sampled point resumes to the fault-free result.
- ``careless_job.py`` overwrites ``ckpt.json`` in place: a strict xfail naming
  ``job_failed("hard_failure")``, so only that documented outcome counts as the
  expected failure; a harness error, a skip or another outcome stays red. Every point
  is run (no ``max_points``; a fraction of a second each), so the verdict does not
  depend on which points a seed samples.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chaos.cli.plugin import job_failed

pytestmark = pytest.mark.chaos

EXAMPLES = Path(__file__).resolve().parents[1] / "chaos" / "examples"


@pytest.mark.slow  # nightly: tests/test_job_cli.py runs the careful job's sampled points on every commit
def test_the_careful_example_survives_every_sampled_point(chaos):
    result = chaos.job([sys.executable, str(EXAMPLES / "careful_job.py"), "--out", "{out}"], ranks=2,
                       max_points=16, result_files=["final-rank*.json"])
    chaos.check(result)
    assert len(result.points) == 16


@pytest.mark.xfail(strict=True, raises=job_failed("hard_failure"),
                   reason="careless_job.py writes ckpt.json in place: a kill after its truncating open "
                          "(e.g. point rank0:op1:after) or before its write leaves an empty or torn file, "
                          "and the resume raises json.decoder.JSONDecodeError (hard_failure)")
def test_the_careless_example_is_a_documented_hard_failure(chaos):
    result = chaos.job([sys.executable, str(EXAMPLES / "careless_job.py"), "--out", "{out}"],
                       result_files=["final.json"])
    chaos.check(result)
