"""The self-check: the fault battery catches every planted defect and passes the correct checkpointer.

The corpus (tests/checkpointers/selfcheck) holds one module per planted defect — each
``correct.py`` with one thing a real team could ship wrong — and ``correct.py`` itself.
The battery (chaos.selfcheck.BATTERY) knows none of them: it runs general fault
scenarios judged by the general oracles. The score (caught / planted, false positives)
is printed and must be 100% with none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import cli
from chaos.selfcheck import (
    BATTERY,
    CheckpointerReport,
    ProbeOutcome,
    SelfCheckOptions,
    SelfCheckReport,
    discover,
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


def _outcome(probe: str, verdict: str, *failing: str) -> ProbeOutcome:
    return ProbeOutcome(probe, (), verdict, list(failing), "x")


def test_score_counts_catches_and_false_positives() -> None:
    report = SelfCheckReport([
        CheckpointerReport("good", "g.py:G", True, [_outcome("a", "pass"), _outcome("b", "skipped")]),
        CheckpointerReport("bad1", "b.py:B", False, [_outcome("a", "pass"), _outcome("b", "fail", "durability")]),
        CheckpointerReport("bad2", "c.py:C", False, [_outcome("a", "pass"), _outcome("b", "error")]),
    ])
    assert [c.name for c in report.caught] == ["bad1"] and [c.name for c in report.missed] == ["bad2"]
    assert report.score == 0.5 and not report.false_positives and not report.passed
    assert "caught 1/2 planted defects (50%), 0 false positive(s)" in report.score_line()
    report.checkpointers[0].outcomes.append(_outcome("c", "fail", "bit_exact"))
    report.checkpointers[2].outcomes.append(_outcome("c", "fail", "liveness"))
    assert report.score == 1.0 and [(n, o.probe) for n, o in report.false_positives] == [("good", "c")]
    assert not report.passed
    report.checkpointers[0].outcomes.pop()
    assert report.passed and report.to_dict()["passed"] is True


def test_cli_rejects_bad_input_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--probe", "no-such-probe"]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS / "missing")]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--only", "nope"]) == 2
    assert cli.main(["selfcheck", "--corpus", str(CORPUS), "--powerloss-states", "0"]) == 2


@pytest.mark.chaos
def test_selfcheck_catches_every_planted_defect_with_no_false_positive(chaos_session, capsys) -> None:
    corpus = discover(CORPUS)
    report = run_selfcheck(corpus, SelfCheckOptions(run=chaos_session.options, fail_fast=True), correct={"correct"})
    with capsys.disabled():
        print()
        render(report)
    assert {c.name for c in report.planted} == set(corpus) - {"correct"}
    missed = {c.name: [(o.probe, o.verdict, o.summary[:200]) for o in c.outcomes] for c in report.missed}
    assert not missed, f"{report.score_line()}; missed: {missed}"
    fps = [(n, o.probe, o.failing, o.summary) for n, o in report.false_positives]
    assert not fps, f"{report.score_line()}; false positives: {fps}"
    errors = [(n, o.probe, o.summary) for n, o in report.correct_errors]
    assert not errors, f"harness errors on the correct checkpointer: {errors}"
    correct = next(c for c in report.checkpointers if c.correct)
    assert [o.probe for o in correct.outcomes] == [p.name for p in BATTERY], "the correct one runs the whole battery"
    assert report.score == 1.0 and report.passed
