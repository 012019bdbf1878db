"""One Check type for every judge (issue #28): the built-in oracles, a job's oracles, certify's properties.

The three names the pipeline grew (``oracles.OracleResult(passed: bool)``, ``judge.job.Oracle(result)``,
certify's ``Verdict(status)``) are gone: every judge builds ``chaos.model.check.Check``, pass, fail or
not judged, with its evidence; each old spelling of a result is read as one of the three.
"""

from __future__ import annotations

import pytest

from chaos.certify.harness import verdict_dict
from chaos.model.check import RESULTS, Check


def test_the_old_names_are_gone_and_every_judge_builds_check() -> None:
    import chaos.certify.battery as battery
    import chaos.judge.job as job
    import chaos.judge.oracles as oracles

    assert not hasattr(oracles, "OracleResult") and not hasattr(job, "Oracle") and not hasattr(battery, "Verdict")
    assert oracles.Check is job.Check is battery.Check is Check


@pytest.mark.parametrize(("given", "result", "passed", "failed", "status"), [
    (True, "pass", True, False, "pass"),           # the built-in oracles' bool
    (False, "fail", False, True, "fail"),
    ("not_judged", "not_judged", True, False, "n/a"),
    ("n/a", "not_judged", True, False, "n/a"),      # certify's word
])
def test_every_spelling_is_read_as_one_result(given: object, result: str, passed: bool, failed: bool,
                                              status: str) -> None:
    c = Check("durability", given, "why", {"k": 1})  # type: ignore[arg-type]
    assert (c.result, c.passed, c.failed, c.status) == (result, passed, failed, status)
    assert c.to_dict() == {"result": result, "summary": "why", "evidence": {"k": 1}}
    assert c.result in RESULTS


def test_a_result_that_is_none_of_them_is_an_error_naming_the_check() -> None:
    with pytest.raises(ValueError, match="check 'bit_exact': result 'maybe'"):
        Check("bit_exact", "maybe", "")


def test_certify_writes_its_properties_with_status_and_time() -> None:
    v = Check("read_after_write", "pass", "ok", seconds=0.12345)
    assert verdict_dict(v) == {"name": "read_after_write", "status": "pass", "summary": "ok", "evidence": {},
                               "seconds": 0.123}
