"""The self-check's job half: every job oracle catches the defect planted for it (issue #28).

The corpus (tests/checkpointers/selfcheck/jobs) holds ``correct.py`` — the careful example
job — and one module per job oracle, each that job with one thing changed and an
``EXPECTED_CATCH`` naming the fault family and oracle meant to catch it. Each is explored
for real, as ``chaos run -- python JOB.py --out {out}`` would explore it; a defect counts
only when its own oracle failed at a point of its own family, and the correct job must
pass every point it is given.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.judge import losscurve
from chaos.run.jobselfcheck import (
    JobSelfCheckOptions,
    declaration,
    discover_as_job,
    discover_jobs,
    job_oracles,
    run_job_selfcheck,
)
from chaos.run.selfcheck import CAUGHT, PASSES, checkpointer_class

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "checkpointers" / "selfcheck" / "jobs"
# one planted defect per job oracle, and a recovery defect only a second fault in a resume shows
PLANTED = {"job:no_fallback": "liveness", "job:no_checksum": "result_files", "job:unlogged_rng": "loss_continuity",
           "job:oldest_first": "durability", "job:term_exit0": "preemption_exit", "job:unpickles": "no_code_execution",
           "job:compacts_first": "durability", "job:float32_load": "committed_state",
           "job:swallows_errors": "no_false_ack"}


def test_the_corpus_plants_one_defect_for_every_job_oracle() -> None:
    found = discover_jobs(CORPUS)
    assert set(found) == {*PLANTED, "job:correct"}
    assert set(PLANTED.values()) == set(job_oracles())
    for name, oracle in PLANTED.items():
        decl = declaration(found[name], correct=False)
        assert oracle in [o for names in decl.expected.values() for o in names], name
        assert "Planted defect" in found[name].read_text().split('"""')[1], f"{name}: the docstring names its defect"
    assert declaration(found["job:correct"], correct=True).expected == {}


def test_every_planted_job_defect_is_caught_by_its_oracle_and_the_correct_job_passes(tmp_path: Path) -> None:
    report = run_job_selfcheck(discover_jobs(CORPUS), JobSelfCheckOptions(scratch_base=str(tmp_path)))
    results = {c.name: c for c in report.checkpointers}
    for name, oracle in PLANTED.items():
        c = results[name]
        assert c.result == CAUGHT, f"{name}: {c.explain()}"
        assert any(oracle in c.intended(o) for o in c.caught_by), name
        assert all(o.replay.startswith("chaos run ") for o in c.caught_by)
    correct = results["job:correct"]
    assert correct.result == PASSES, correct.explain()
    assert {o.probe for o in correct.outcomes} >= {"kill", "corrupt", "term"}  # it was really exercised
    assert report.passed and report.score == 1.0
    # the recovery defect is caught only where a point was struck again inside its resume: the first point
    # to fail (the sampled points are judged before those struck again) is one of them
    [kill] = results["job:compacts_first"].caught_by
    first_failed = kill.summary.split(": ")[0]
    assert "+rank0:op" in first_failed and f"+{first_failed.split('+')[1]} -- " in kill.replay, kill.summary
    assert not list(tmp_path.iterdir())  # every exploration's scratch root removed


def test_chaos_selfcheck_runs_the_job_corpus_and_scores_it(tmp_path: Path) -> None:
    out = tmp_path / "sc.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "selfcheck", "--only",
                           "job:term_exit0,job:unpickles,job:correct", "--max-points", "12", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert (doc["planted"], doc["caught"], doc["false_positives"]) == (2, 2, [])
    assert "caught 2/2 planted defects" in proc.stdout


@pytest.mark.parametrize(("body", "match"), [
    ("X = 1\n", "declares CHAOS_JOB"),
    ("CHAOS_JOB = {'faults': ('kill',), 'bogus': 1}\n", "unknown key"),
    ("CHAOS_JOB = {'faults': ('nope',)}\n", "--faults"),
    ("CHAOS_JOB = {'max_points': 0}\n", "positive integer"),
    ("CHAOS_JOB = {}\nEXPECTED_CATCH = {'kill': ('atomic_commit',)}\n", "unknown oracle"),
    ("CHAOS_JOB = {}\nEXPECTED_CATCH = {'bitflip-newest-s0': ('durability',)}\n", "unknown probe"),
    ("CHAOS_JOB = {}\n", "must declare"),
    # a checkpointer of the corpus run inside the built-in workload as a job
    ("CHAOS_AS_JOB = {'faults': ('kill',), 'bogus': 1}\nclass XCheckpointer: ...\n", "unknown key"),
    ("CHAOS_AS_JOB = {'steps': 0}\nclass XCheckpointer: ...\n", r"\['steps'\] must be a positive integer"),
    ("CHAOS_AS_JOB = {}\nEXPECTED_JOB_CATCH = {'kill': ('durability',)}\n", "defines no \\*Checkpointer class"),
    ("CHAOS_AS_JOB = {}\nclass XCheckpointer: ...\n", "must declare .*EXPECTED_JOB_CATCH"),
])
def test_a_malformed_declaration_is_an_error_naming_the_file(tmp_path: Path, body: str, match: str) -> None:
    path = tmp_path / "defect.py"
    path.write_text(body)
    with pytest.raises(ConfigError, match=match) as info:
        declaration(path, correct=False)
    assert str(path) in str(info.value)


def test_a_loss_said_by_the_probe_and_printed_is_read_from_one_source() -> None:
    """A job that calls probe.step(n, loss) and prints a --loss-regex line says each loss twice, the
    printed one rounded: a halted attempt whose last step only got printed is not compared, rounded,
    against the exact golden value (a false loss_continuity failure of the correct job)."""
    def says(kind: str, n: int, loss: float) -> dict:
        return {"event": "phase", "name": "chaos.probe", "info": {"kind": kind, "n": n, "loss": loss}}

    exact = 3.1694612345
    golden = {(0, 0): [says("loss", 4, 3.169461), says("step", 4, exact)]}
    halted = {(0, 0): [says("loss", 4, 3.169461)]}  # stopped as it announced step 4: no probe.step yet
    kind = losscurve.source(golden)
    assert kind == "step"
    assert losscurve.curves(golden, kind=kind) == {0: {4: exact}}
    assert losscurve.curves(halted, kind=kind) == {}
    assert losscurve.continuity({0: {4: exact}}, 1, halted, 0.0, kind).passed
    assert not losscurve.continuity({0: {4: exact}}, 1, halted, 0.0, None).passed  # what it did before


# ---------------------------------------------------------------------- the checkpointer corpus, as jobs
CHECKPOINTERS = CORPUS.parent
# every checkpointer that declares CHAOS_AS_JOB: the job family and oracle meant to catch it inside the workload
AS_JOB = {"as-job:no_optimizer": ("kill", "committed_state"), "as-job:tensors_only": ("kill", "committed_state"),
          "as-job:async_no_snapshot": ("kill", "committed_state"), "as-job:in_place": ("errno", "durability"),
          "as-job:no_checksum": ("payload", "no_code_execution"),
          "as-job:pickled_manifest": ("payload", "no_code_execution"), "as-job:no_fsync": ("power", "durability"),
          "as-job:no_dir_fsync": ("power", "durability")}


def test_a_checkpointer_of_the_corpus_runs_inside_the_built_in_workload_as_a_job() -> None:
    found = discover_as_job(CHECKPOINTERS)
    assert set(found) == {*AS_JOB, "as-job:correct"}
    for name, (family, oracle) in AS_JOB.items():
        decl = declaration(found[name], correct=False)
        assert decl.expected == {family: (oracle,)}, name
        assert decl.spec.faults == (family,) and decl.spec.ranks == 2 and decl.spec.result_globs == ("final-rank*.json",)
        cmd = decl.spec.command
        assert cmd[1:5] == ("-m", "chaos.target.workload", "{out}", "--checkpointer"), cmd
        assert cmd[5] == f"{found[name].resolve()}:{checkpointer_class(found[name])}"
        assert cmd[6:] == ("--steps", "8", "--save-every", "2")
    assert declaration(found["as-job:correct"], correct=True).expected == {}


@pytest.mark.slow  # the whole corpus as jobs: about four minutes on 2 cores
def test_every_planted_checkpointer_defect_is_caught_inside_the_workload_as_a_job(tmp_path: Path) -> None:
    report = run_job_selfcheck(discover_as_job(CHECKPOINTERS), JobSelfCheckOptions(jobs=1,
                                                                                   scratch_base=str(tmp_path)))
    results = {c.name: c for c in report.checkpointers}
    for name, (_family, oracle) in AS_JOB.items():
        c = results[name]
        assert c.result == CAUGHT, f"{name}: {c.explain()}"
        assert any(oracle in c.intended(o) for o in c.caught_by), name
    correct = results["as-job:correct"]
    assert correct.result == PASSES, correct.explain()
    assert {o.probe for o in correct.outcomes} >= {"kill", "power"}
    assert report.passed


def test_chaos_selfcheck_as_job_scores_a_checkpointer_inside_the_workload(tmp_path: Path) -> None:
    out = tmp_path / "sc.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "selfcheck", "--as-job", "--only",
                           "as-job:no_optimizer", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert (doc["planted"], doc["caught"], doc["false_positives"]) == (1, 1, [])
