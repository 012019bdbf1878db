"""A strict xfail counts only the documented failure, and a property run of skips alone fails.

``chaos.check`` raises ``oracle_failed(name)`` for a failed verdict (a type per failing
oracle), so ``xfail(strict=True, raises=oracle_failed("atomic_commit"))`` is expected
only when atomic_commit failed: another oracle's failure, a harness error or a skip
stays red. Every strict xfail in suites/ and tests/ names ``raises=``.

The property suites (suites/test_properties.py, suites/test_stateful.py), run with
every scenario skipped, must fail rather than pass on nothing. They run here in a
pytester session whose scenarios are replaced by a stand-in returning "skipped".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos.cli.plugin import ChaosRunner, ChaosVerdictError, OracleFailed, oracle_failed
from chaos.model.check import Check
from chaos.plan.scenario import Scenario
from chaos.run.runner import ScenarioResult

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]


def _result(verdict: str, *failing: str) -> ScenarioResult:
    oracles = {n: Check(n, n not in failing, "x") for n in ("atomic_commit", "bit_exact", *failing)}
    return ScenarioResult(Scenario("reference"), verdict, oracles=oracles)


def test_check_raises_the_failing_oracles_type():
    chaos = ChaosRunner(None, lambda *a: None)
    with pytest.raises(oracle_failed("atomic_commit")) as one:
        chaos.check(_result("fail", "atomic_commit"))
    assert not isinstance(one.value, oracle_failed("bit_exact")) and one.value.result.verdict == "fail"
    with pytest.raises(oracle_failed("atomic_commit")) as both:
        chaos.check(_result("fail", "atomic_commit", "bit_exact"))
    assert isinstance(both.value, oracle_failed("bit_exact"))
    with pytest.raises(ChaosVerdictError) as error:
        chaos.check(_result("error"))
    assert not isinstance(error.value, OracleFailed)
    chaos.check(_result("pass"))


XFAILS = '''
import pytest
from chaos.model.check import Check
from chaos.cli.plugin import ChaosRunner, oracle_failed
from chaos.run.runner import ScenarioResult
from chaos.plan.scenario import Scenario

def result(verdict, *failing):
    return ScenarioResult(Scenario("reference"), verdict,
                          oracles={n: Check(n, "fail", "x") for n in failing})

documented = pytest.mark.xfail(strict=True, raises=oracle_failed("atomic_commit"), reason="documented")

@documented
def test_the_documented_oracle_fails():
    ChaosRunner(None, lambda *a: None).check(result("fail", "atomic_commit"))

@documented
def test_another_oracle_fails():
    ChaosRunner(None, lambda *a: None).check(result("fail", "bit_exact"))

@documented
def test_the_harness_errs():
    ChaosRunner(None, lambda *a: None).check(result("error"))

@documented
def test_something_else_breaks():
    raise KeyError("atomic_commit")
'''


def test_an_xfail_naming_an_oracle_expects_only_that_oracles_failure(pytester):
    pytester.makepyfile(test_xfails=XFAILS)
    run = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", "addopts=")
    run.assert_outcomes(xfailed=1, failed=3)


def test_every_strict_xfail_names_raises():
    missing = []
    for path in sorted([*REPO.glob("suites/*.py"), *REPO.glob("tests/*.py")]):
        text = path.read_text()
        for match in re.finditer(r"xfail\((?:[^()]|\([^()]*\))*\)", text):
            call = match.group(0)
            if "strict=True" in call and "raises=" not in call:
                missing.append(f"{path.relative_to(REPO)}: {call[:80]}")
    assert not missing, missing


ALL_SKIPPED = '''
import pytest
from chaos.cli import plugin
from chaos.record import points
from chaos.record.points import IOPoint, PhasePoint, TracePoints
from chaos.run.runner import ScenarioResult

POINTS = TracePoints([IOPoint(r, "write", "shard", "write_shards", s, 1) for r in (0, 1) for s in (4, 8, 12)],
                     [PhasePoint(r, "save", s) for r in (0, 1) for s in (4, 8, 12)])

@pytest.fixture(autouse=True)
def every_scenario_skipped(monkeypatch):
    def skipped(scenario, options=None, progress=None):
        scenario.validate()
        return ScenarioResult(scenario, "skipped", error="skipped: stand-in: no fault fired")
    monkeypatch.setattr(plugin, "run_scenario", skipped)
    monkeypatch.setattr(points, "reference_points", lambda scenario, options: POINTS)
'''


@pytest.mark.parametrize("suite", ["test_properties.py", "test_stateful.py"])
def test_a_property_suite_whose_every_example_was_skipped_fails(pytester, suite):
    pytester.makeconftest(ALL_SKIPPED)
    pytester.makepyfile(**{"test_copy_of_" + suite[5:-3]: (REPO / "suites" / suite).read_text()})
    run = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", "addopts=")
    run.assert_outcomes(failed=1)
    assert "were skipped, so the property tested nothing" in run.stdout.str()
