"""The self-check: the fault battery catches every planted defect with the oracle meant for it.

The corpus (tests/checkpointers/selfcheck) holds one module per planted defect — each
``correct.py`` with one thing a real team could ship wrong, and an ``EXPECTED_CATCH``
naming the probe(s) and oracle(s) meant to catch it — and ``correct.py`` itself. The
battery (chaos.run.selfcheck.BATTERY) knows none of them: it runs general fault scenarios
judged by the general oracles. A defect counts as caught only when its intended oracle
failed in its intended probe; the score (caught / planted, false positives) is printed
and must be 100% with none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.cli import main as cli
from chaos.errors import ConfigError
from chaos.model.check import Check
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run import selfcheck
from chaos.run.runner import ScenarioResult
from chaos.run.selfcheck import (
    BATTERY,
    CAUGHT,
    PROBES,
    WRONG_ORACLE,
    CheckpointerReport,
    ProbeOutcome,
    SelfCheckOptions,
    SelfCheckReport,
    discover,
    expected_catch,
    known_oracles,
    render,
    run_selfcheck,
)

CORPUS = Path(__file__).resolve().parent / "checkpointers" / "selfcheck"
PLANTED = {"tensors_only", "no_optimizer", "no_checksum", "no_fsync", "no_dir_fsync", "in_place",
           "async_no_snapshot", "swallow_errors"}


def test_corpus_has_every_planted_defect_and_a_correct_one() -> None:
    found = discover(CORPUS)
    assert PLANTED | {"correct"} <= set(found)
    for name, spec in found.items():
        path, _, cls = spec.rpartition(":")
        doc = Path(path).read_text().split('"""')[1]
        assert cls.endswith("Checkpointer")
        assert ("Planted defect" in doc) == (name != "correct"), f"{name}: docstring must name its one defect"


def test_every_planted_defect_declares_its_intended_catch() -> None:
    found = discover(CORPUS)
    for name in PLANTED:
        expected = expected_catch(found[name])
        assert expected and set(expected) <= set(PROBES), name
        assert all(ns and set(ns) <= set(known_oracles()) for ns in expected.values()), name
    assert expected_catch(found["no_fsync"]) == {"powerloss": ("atomic_commit",)}
    with pytest.raises(ConfigError, match=r"correct\.py: a planted defect must declare"):
        expected_catch(found["correct"])


@pytest.mark.parametrize("text, error", [
    ("X = 1\n", "must declare the probe"),
    ("EXPECTED_CATCH = {'no-such-probe': ('durability',)}\n", "unknown probe 'no-such-probe'"),
    ("EXPECTED_CATCH = {'powerloss': ('no_such_oracle',)}\n", "unknown oracle.s. no_such_oracle"),
    ("EXPECTED_CATCH = {'powerloss': ()}\n", "non-empty tuple of oracle names"),
    ("EXPECTED_CATCH = dict(powerloss=('atomic_commit',))\n", "is not a literal"),
    ("EXPECTED_CATCH = {}\n", "non-empty dict"),
])
def test_a_malformed_declaration_is_a_config_error_naming_the_file(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "mine.py"
    path.write_text(text + "class MineCheckpointer:\n    pass\n")
    with pytest.raises(ConfigError, match=error) as info:
        expected_catch(f"{path}:MineCheckpointer")
    assert str(path) in str(info.value)


def _outcome(probe: str, verdict: str, *failing: str) -> ProbeOutcome:
    return ProbeOutcome(probe, (), verdict, list(failing), "x")


def test_score_counts_only_catches_by_the_intended_oracle() -> None:
    report = SelfCheckReport([
        CheckpointerReport("good", "g.py:G", True, [_outcome("a", "pass"), _outcome("b", "skipped")]),
        CheckpointerReport("bad1", "b.py:B", False, [_outcome("a", "pass"), _outcome("b", "fail", "durability")],
                           expected={"b": ("durability",)}),
        CheckpointerReport("bad2", "c.py:C", False, [_outcome("a", "pass"), _outcome("b", "error")],
                           expected={"b": ("durability",)}),
    ])
    assert [c.name for c in report.caught] == ["bad1"] and [c.name for c in report.missed] == ["bad2"]
    assert report.score == 0.5 and not report.false_positives and not report.passed
    assert "caught 1/2 planted defects by the intended oracle (50%), 0 false positive(s)" in report.score_line()
    report.checkpointers[0].outcomes.append(_outcome("c", "fail", "bit_exact"))
    report.checkpointers[2].outcomes.append(_outcome("c", "fail", "durability", "liveness"))
    assert [(n, o.probe) for n, o in report.false_positives] == [("good", "c")]
    # bad2 failed, with its intended oracle even, but in a probe not meant for it: a miss.
    assert report.checkpointers[2].result == WRONG_ORACLE and report.score == 0.5
    assert [c.name for c in report.wrong_oracle] == ["bad2"]
    report.checkpointers[2].outcomes[1] = _outcome("b", "fail", "liveness", "durability")
    assert report.checkpointers[2].result == CAUGHT and report.score == 1.0
    assert report.checkpointers[2].intended(report.checkpointers[2].outcomes[1]) == ["durability"]
    report.checkpointers[0].outcomes.pop()
    assert report.passed and report.to_dict()["passed"] is True


def _probe_of(scenario: Scenario) -> str:
    """Which probe of the battery a scenario is (power loss carries the options' max_states)."""
    fault = scenario.faults[0]
    if fault.kind == "powerloss":
        return "powerloss"
    return next(p.name for p in BATTERY if parse_fault(p.faults[0]) == fault)


def _fake_runs(monkeypatch: pytest.MonkeyPatch, failing: dict[tuple[str, str], tuple[str, ...]]) -> list[Scenario]:
    """Replace the runner by fabricated results: ``failing[(checkpointer stem, probe)]`` fail, the rest pass."""
    ran: list[Scenario] = []

    def fake(scenario: Scenario, options: object = None) -> ScenarioResult:
        ran.append(scenario)
        names = failing.get((Path(scenario.checkpointer.rpartition(":")[0]).stem, _probe_of(scenario)), ())
        oracles = {n: Check(n, n not in names, f"{n} {'failed' if n in names else 'passed'}")
                   for n in ("liveness", "durability", "atomic_commit", *names)}
        return ScenarioResult(scenario, "fail" if names else "pass", oracles=oracles)

    monkeypatch.setattr(selfcheck, "run_scenario", fake)
    return ran


def test_a_defect_failed_only_by_an_unintended_oracle_is_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A harness bug: liveness fails in every probe of the defect. The old rule ("any
    # oracle failed") scored that as caught; the intended oracle (atomic_commit in the
    # powerloss probe) never failed, so it is a miss, reported with what did fail.
    _fake_runs(monkeypatch, {("no_fsync", p.name): ("liveness",) for p in BATTERY})
    corpus = discover(CORPUS)
    report = run_selfcheck({"no_fsync": corpus["no_fsync"], "correct": corpus["correct"]},
                           SelfCheckOptions(fail_fast=True))
    bad = report.checkpointers[0]
    assert bad.result == WRONG_ORACLE and not bad.caught and not bad.caught_by
    assert [c.name for c in report.missed] == ["no_fsync"] and report.score == 0.0 and not report.passed
    assert len(bad.outcomes) == len(BATTERY), "fail-fast waits for the intended catch, not any failure"
    assert "1 caught only by the wrong oracle" in report.score_line()
    why = bad.explain()
    assert "kill-between-saves: liveness" in why and "intended: powerloss: atomic_commit" in why
    d = report.to_dict()
    assert d["wrong_oracle"] == ["no_fsync"] and d["missed"] == ["no_fsync"]
    entry = d["checkpointers"][0]
    assert entry["result"] == "caught by the wrong oracle" and entry["caught_by"] == []
    assert entry["intended"] == [{"probe": "powerloss", "oracles": ["atomic_commit"]}]
    assert {f["probe"] for f in entry["failed"]} == set(PROBES) and all(f["intended"] == [] for f in entry["failed"])


def test_the_intended_oracle_catches_and_fail_fast_stops_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # liveness fails early (not meant for it), then atomic_commit fails in powerloss: caught.
    ran = _fake_runs(monkeypatch, {("no_fsync", "kill-at-save"): ("liveness",),
                                   ("no_fsync", "powerloss"): ("atomic_commit", "durability")})
    corpus = discover(CORPUS)
    report = run_selfcheck({"no_fsync": corpus["no_fsync"]}, SelfCheckOptions(fail_fast=True, powerloss_states=7))
    bad = report.checkpointers[0]
    assert bad.result == CAUGHT and [o.probe for o in bad.caught_by] == ["powerloss"]
    assert [o.probe for o in bad.outcomes] == [p.name for p in BATTERY[:BATTERY.index(PROBES["powerloss"]) + 1]]
    assert bad.intended(bad.caught_by[0]) == ["atomic_commit"] and report.passed
    assert ran[-1].faults[0].param("max_states") == 7 and bad.outcomes[-1].faults == ("all:step8:power,max_states=7",)


def test_cli_json_carries_intended_oracle_probe_result_and_failures(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_runs(monkeypatch, {("no_fsync", "powerloss"): ("liveness",), ("in_place", "crash-mid-write"): ("durability",)})
    out = tmp_path / "selfcheck.json"
    args = ["selfcheck", "--corpus", str(CORPUS), "--only", "no_fsync,in_place,correct", "--json", str(out)]
    assert cli.main(args + ["--probe", "powerloss", "--probe", "crash-mid-write"]) == 1
    report = json.loads(out.read_text())
    by = {c["name"]: c for c in report["checkpointers"]}
    assert by["in_place"]["result"] == "caught"
    assert by["in_place"]["caught_by"] == [{"probe": "crash-mid-write", "oracles": ["durability"]}]
    assert by["no_fsync"]["result"] == "caught by the wrong oracle"
    assert by["no_fsync"]["failed"][0]["probe"] == "powerloss" and by["no_fsync"]["failed"][0]["oracles"] == ["liveness"]
    assert by["correct"]["result"] == "passes" and report["passed"] is False
    assert "no_fsync: caught by the wrong oracle: failed only checks not meant for it: powerloss: liveness" \
        in " ".join(capsys.readouterr().out.split())
    _fake_runs(monkeypatch, {("no_fsync", "powerloss"): ("atomic_commit",),
                             ("in_place", "crash-mid-write"): ("durability",)})
    assert cli.main(args + ["--probe", "powerloss", "--probe", "crash-mid-write"]) == 0
    assert json.loads(out.read_text())["passed"] is True


def test_cli_writes_the_json_before_rendering(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A crash while rendering (foreign text that rich chokes on, say) must not lose the results.
    _fake_runs(monkeypatch, {("in_place", "crash-mid-write"): ("durability",)})

    def broken(report: SelfCheckReport, console: object = None) -> None:
        raise RuntimeError("rendering broke")

    monkeypatch.setattr(selfcheck, "render", broken)
    out = tmp_path / "selfcheck.json"
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--only", "in_place", "--probe", "crash-mid-write",
                     "--json", str(out)]) == 2
    assert json.loads(out.read_text())["checkpointers"][0]["result"] == "caught"


def test_cli_rejects_bad_input_with_status_2(tmp_path: Path) -> None:
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--probe", "no-such-probe"]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS / "missing")]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--only", "nope"]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--powerloss-states", "0"]) == 2
    undeclared = tmp_path / "mine.py"
    undeclared.write_text("class MineCheckpointer:\n    pass\n")
    assert cli.main(["selfcheck", "--checkpointer", f"mine={undeclared}:MineCheckpointer"]) == 2


@pytest.mark.chaos
@pytest.mark.slow  # 33 s; the nightly runs it (.ci/nightly), and a CI run of 425d65e took 889 s of its 900
def test_selfcheck_catches_every_planted_defect_with_no_false_positive(chaos_session, capsys) -> None:
    corpus = discover(CORPUS)
    report = run_selfcheck(corpus, SelfCheckOptions(run=chaos_session.options, fail_fast=True), correct={"correct"})
    with capsys.disabled():
        print()
        render(report)
    assert {c.name for c in report.planted} == set(corpus) - {"correct"}
    missed = {c.name: (c.result, c.explain()[:300]) for c in report.missed}
    assert not missed, f"{report.score_line()}; not caught by the intended oracle: {missed}"
    for c in report.planted:
        hit = c.caught_by[0]
        assert hit.probe in c.expected and set(c.intended(hit)) <= set(c.expected[hit.probe]), c.name
    fps = [(n, o.probe, o.failing, o.summary) for n, o in report.false_positives]
    assert not fps, f"{report.score_line()}; false positives: {fps}"
    errors = [(n, o.probe, o.summary) for n, o in report.correct_errors]
    assert not errors, f"harness errors on the correct checkpointer: {errors}"
    correct = next(c for c in report.checkpointers if c.correct)
    assert [o.probe for o in correct.outcomes] == [p.name for p in BATTERY], "the correct one runs the whole battery"
    assert report.score == 1.0 and report.passed
