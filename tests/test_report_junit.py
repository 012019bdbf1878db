"""JUnit XML (``--junit``) from each results document: built-in scenarios, a job's points, a certification.

Read back with the standard library's ElementTree and with ``junitparser`` (a dev
dependency): one testcase per scenario / point / property, counts that add up, the
failing oracles' summaries in ``message`` and the replay command in the failure text,
skip reasons in ``<skipped message>``.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.model.check import Check
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.results import results_document
from chaos.run.runner import ScenarioResult
from reports.junit import junit_tree, write_junit

REPO = Path(__file__).resolve().parent.parent
BROKEN = str(REPO / "tests" / "backends" / "broken.py")


def _scenario(spec: str) -> Scenario:
    return Scenario(checkpointer="reference", faults=[parse_fault(spec)])


def builtin_doc() -> dict:
    """A results document as chaos.run.results writes it: one scenario of each verdict."""
    ok = Check("bit_exact", "pass", "final state equals the golden run", {})
    bad = Check("bit_exact", "fail", "rank 0 final state: first differing tensor 'model/w'", {})
    loss = Check("loss_continuity", "fail", "rank 0 step 4 (attempt 1): loss 4.57 is -16.90% off", {})
    results = [
        ScenarioResult(_scenario("kill:rank=1,step=23"), "pass", {"bit_exact": ok}, seconds=3.25),
        ScenarioResult(_scenario("kill:rank=1,step=13"), "fail", {"bit_exact": bad, "loss_continuity": loss,
                                                                  "durability": ok}, seconds=5.5),
        ScenarioResult(_scenario("term:rank=0,step=12,grace=2"), "error", {},
                       error="RuntimeError: the fork server died\nwhile starting rank 1", seconds=1.0),
        ScenarioResult(_scenario("kill:rank=1,step=5,attempt=1"), "skipped", {"bit_exact": ok},
                       error="skipped: fault kill:rank=1,step=5,attempt=1 never fired", seconds=2.0),
    ]
    return results_document(results)


def _read(tree_or_path) -> ET.Element:
    if isinstance(tree_or_path, Path):
        return ET.parse(tree_or_path).getroot()
    return ET.fromstring(ET.tostring(tree_or_path.getroot(), encoding="unicode"))


def _cases(root: ET.Element) -> dict[str, ET.Element]:
    return {tc.get("name"): tc for tc in root.iter("testcase")}


def _check_counts(root: ET.Element) -> None:
    """The suite's and the root's counts are the testcases' own (what every JUnit reader checks)."""
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    want = {"tests": len(cases), "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(1 for c in cases if c.find("skipped") is not None)}
    for el in (root, suite):
        assert {k: int(el.get(k)) for k in want} == want
        assert float(el.get("time")) >= 0
    assert suite.get("timestamp") and suite.get("hostname")
    # the common schema's order: properties first, then testcases, then system-out
    tags = [child.tag for child in suite]
    assert tags == sorted(tags, key=lambda t: {"properties": 0, "testcase": 1}.get(t, 2))
    for c in cases:
        assert c.get("classname") and c.get("name") and float(c.get("time")) >= 0
        assert len(list(c)) <= 1


def test_builtin_scenarios_map_to_pass_failure_error_and_skipped():
    doc = builtin_doc()
    root = _read(junit_tree(doc))
    _check_counts(root)
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "1", "1")
    assert float(suite.get("time")) == pytest.approx(11.75)
    cases = _cases(root)
    assert set(cases) == {s["id"] for s in doc["scenarios"]}
    assert all(c.get("classname") == "reference" for c in cases.values())

    failed = cases["reference-rank1_step13_kill-seed0"]
    failure = failed.find("failure")
    assert failure.get("message") == ("bit_exact: rank 0 final state: first differing tensor 'model/w'; "
                                      "loss_continuity: rank 0 step 4 (attempt 1): loss 4.57 is -16.90% off")
    assert failure.get("type") == "bit_exact"
    replay = doc["scenarios"][1]["replay"]
    assert f"replay: {replay}" in failure.text.splitlines()
    assert "durability" not in failure.text  # only the failing oracles

    error = cases["reference-rank0_step12_term_grace=2-seed0"].find("error")
    assert error.get("message") == "RuntimeError: the fork server died while starting rank 1"
    assert "while starting rank 1" in error.text and "replay: chaos run" in error.text

    skipped = cases["reference-rank1_step5_kill_attempt=1-seed0"].find("skipped")
    assert skipped.get("message") == "fault kill:rank=1,step=5,attempt=1 never fired"
    assert cases["reference-rank1_step23_kill-seed0"].find("*") is None  # a pass has no child


def test_campaign_coverage_goes_to_system_out():
    doc = builtin_doc()
    doc["campaign"] = {"family_scenarios": 7, "budget_s": 60.0, "seed": 0, "generated": 3, "generated_skipped": 1,
                       "skipped": [], "coverage": {"seen": 20, "tried": 9, "io_faults_drawn": 4,
                                                   "io_faults_fired": 3, "trace_error": None}}
    out = _read(junit_tree(doc)).find("testsuite/system-out").text
    assert "7 family scenario(s), 3 generated schedule(s), 1 skipped within a 60 s budget" in out
    assert "9 of 20 (rank, operation, file role, phase) points tried; 3 of 4 drawn I/O fault(s) fired" in out


def test_characters_xml_cannot_hold_are_escaped_not_fatal(tmp_path):
    doc = builtin_doc()
    doc["scenarios"][2]["error"] = "rank 1 wrote \x1b[31mred\x00 and \ud800 to stderr"
    path = write_junit(doc, tmp_path / "sub" / "junit.xml")
    error = _cases(ET.parse(path).getroot())["reference-rank0_step12_term_grace=2-seed0"].find("error")
    assert error.get("message") == "rank 1 wrote \\u001b[31mred\\u0000 and \\ud800 to stderr"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["junit.xml"]  # no temp file left


def test_certification_campaign_and_verdict_cases():
    """The campaign entries of chaos.certify.run_campaign and the certified verdict are cases too."""
    doc = {"schema_version": 1, "kind": "certification", "backend": "s3-local", "certified": False,
           "failing": ["campaign: kill mid-save"], "partial": None, "cleanup_error": None,
           "properties": [{"name": "read_after_write", "status": "pass", "summary": "ok", "seconds": 0.1}],
           "campaign": [{"name": "kill mid-save", "faults": ["kill:rank=1,phase=write_shards,step=15"],
                         "verdict": "fail", "error": None, "seconds": 9.5,
                         "oracles": {"bit_exact": {"passed": False, "summary": "rank 1 differs"},
                                     "durability": {"passed": True, "summary": "ok"}},
                         "replay": "chaos run --fault kill:rank=1,phase=write_shards,step=15"}],
           "dcp": [{"name": "bitflip_detected", "status": "fail", "summary": "loaded silently", "seconds": 0.2}]}
    root = _read(junit_tree(doc))
    _check_counts(root)
    cases = _cases(root)
    assert set(cases) == {"read_after_write", "campaign: kill mid-save", "dcp: bitflip_detected", "certified"}
    assert {c.get("classname") for c in cases.values()} == {"s3-local"}
    camp = cases["campaign: kill mid-save"].find("failure")
    assert camp.get("message") == "bit_exact: rank 1 differs"
    assert "replay: chaos run --fault kill:rank=1,phase=write_shards,step=15" in camp.text
    assert "NOT CERTIFIED: failing: campaign: kill mid-save" in cases["certified"].find("failure").get("message")


def test_a_document_of_another_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="scenarios"):
        junit_tree({"hello": 1})


def _certify(tmp_path: Path, backend: str, only: str, *extra: str) -> ET.Element:
    junit = tmp_path / f"{only}.xml"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", backend, "--only", only,
                           "--no-campaign", "--throughput-mib", "0", "--scratch", str(tmp_path), "--junit", str(junit),
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # partial runs are never certified
    root = ET.parse(junit).getroot()
    _check_counts(root)
    return root


def test_certify_writes_junit_with_passing_skipped_and_failing_properties(tmp_path):
    """Real `chaos certify` runs (partial: about 3 s each). On an fsspec URL read_after_write passes and
    concurrent_writers is n/a (skipped, with its reason); a listing that lags fails read_after_write;
    either way the partial run is not certified, and the JUnit file says so in a case of its own."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    root = _certify(tmp_path, f"local://{tmp_path / 'a'}", "read_after_write,concurrent_writers")
    cases = _cases(root)
    assert set(cases) == {"read_after_write", "concurrent_writers", "certified"}
    assert cases["read_after_write"].find("*") is None
    assert "check-then-put" in cases["concurrent_writers"].find("skipped").get("message")
    assert "partial run (--only; --no-campaign)" in cases["certified"].find("failure").get("message")
    assert {p.get("name"): p.get("value") for p in root.iter("property")}["certified"] == "false"

    root = _certify(tmp_path, f"file://{tmp_path / 'b'}", "read_after_write", "--wrapper", f"{BROKEN}:LaggingList")
    failure = _cases(root)["read_after_write"].find("failure")
    assert "list-after-write: step 1 acknowledged but a fresh reader lists []" == failure.get("message")
    assert "failing: read_after_write" in _cases(root)["certified"].find("failure").get("message")


def test_junitparser_reads_it_back(tmp_path):
    import junitparser  # a dev dependency: a widely used JUnit reader, beside ElementTree above
    path = write_junit(builtin_doc(), tmp_path / "junit.xml")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 1, 1, 1)


@pytest.mark.parametrize(("spec", "classname"), [
    ("tests/checkpointers/selfcheck/no_fsync.py:NoFsyncCheckpointer", "tests.checkpointers.selfcheck.no_fsync.NoFsyncCheckpointer"),
    ("/home/me/.venv/ck.py:Ckpt", "home.me._venv.ck.Ckpt"),
    ("mypkg.ckpt:Ckpt", "mypkg.ckpt.Ckpt"),
    ("reference", "reference"),
    ("dcp-async", "dcp-async"),
    (str(REPO / "tests" / "checkpointers" / "x.py") + ":C", "tests.checkpointers.x.C"),  # under the cwd: relative
])
def test_a_checkpointer_spec_becomes_a_dotted_classname_and_the_replay_keeps_it_verbatim(spec, classname, monkeypatch):
    monkeypatch.chdir(REPO)
    bad = Check("bit_exact", "fail", "differs", {})
    result = ScenarioResult(Scenario(checkpointer=spec, faults=[parse_fault("kill:rank=1,step=13")]), "fail",
                            {"bit_exact": bad}, seconds=1.0)
    doc = results_document([result])
    (case,) = _cases(_read(junit_tree(doc))).values()
    assert case.get("classname") == classname
    assert spec in case.find("failure").text, "the replay command names the checkpointer as given"
