"""Failing job points grouped by cause (``reports.causes``), in every report.

A careless job fails dozens of points for one defect; the reports must show that defect
once, with its fix. The document here is shaped like ``chaos.run.results.job_results_document`` writes it (the
fault records, crash-state ``lost`` entries, liveness output tails and verdict lines of a
real ``careless_job.py`` run): 30 points of one defect (``ckpt.json`` rewritten in place:
kills, ENOSPC and power cuts mid-write, failing the resume with varying
``JSONDecodeError`` messages), three more of a torch file written the same way (with a
message longer than the 200 characters the verdict line keeps), and a few of other
defects — a power cut that lost the directory entry, one that lost only data, bit rot
loaded as good, a network cut nobody knows a fix for. The last test runs the real job.
"""

from __future__ import annotations

import copy
import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import junitparser
import pytest

from reports.causes import KINDS, NO_FIX, console_lines, group
from reports.html import render_html
from reports.junit import junit_tree, write_junit
from reports.summary import markdown_summary

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["python", "careless_job.py", "--out", "{out}"]
IN_PLACE_FIX = ("a kill or power cut mid-write leaves it torn — write a temp file, fsync it, rename it over, fsync "
                "the directory")
TORCH = ("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory. This is "
         "an internal miniz error. If you are seeing this error, please report it to the PyTorch maintainers with "
         "the file that caused it: /tmp/chaos-job-k2/point-00077/out/model.pt (archive of 4096 bytes)")


def _tail(line: str) -> str:
    return ("Traceback (most recent call last):\n  File \"careless_job.py\", line 41, in main\n"
            "    saved = json.load(f)  # an empty or half-written file raises here\n"
            "            ^^^^^^^^^^^^\n" + line + "\n")


def point(pid: str, kind: str, when: str | None, event: str | None, path: str | None, nth: int | None,
          outcome: str, line: str = "", what: str | None = None, applied: dict[str, Any] | None = None,
          failing: str = "liveness", n: int = 0) -> dict[str, Any]:
    """A failing point as ``chaos.run.results`` records it (``chaos.judge.job`` wrote its lines)."""
    params = {k: v for k, v in (("op", n), ("when", when), ("event", event), ("path", path), ("seq", 2 * n),
                                ("nth", nth)) if v is not None}
    out = f"/tmp/chaos-job-k2/point-{n:05d}/out"
    oracles: dict[str, Any] = {"liveness": {"result": "pass", "summary": "the job finished after 1 restart(s)",
                                            "evidence": {"attempts": []}}}
    if outcome == "hard_failure":
        why = "the resume exited 1 (1 restart(s) of 1 allowed)" + (f": {line.strip()[:200]}" if line else "")
        oracles["liveness"] = {"result": "fail", "summary": why,
                               "evidence": {"attempts": [], "output_tail": _tail(line) if line else ""}}
        oracles["result_files"] = {"result": "not_judged", "summary": "the job did not finish", "evidence": {}}
    elif outcome == "lost_work":
        why = ("rank 0 resumed from scratch, but its checkpoint of step 9 was complete (chaos.probe.saved): 9 "
               "step(s) of work lost")
        oracles["durability"] = {"result": "fail", "summary": why, "evidence": {}}
    else:
        why = f"{failing}: final.json: weights[0]: values differ"
        oracles[failing] = {"result": "fail", "summary": why, "evidence": {}}
    anchor = f"@{event}:{path}:{nth}" if event else ""
    return {"id": pid, "seed": 0, "checkpointer": "job", "backend": "file", "world_size": 1,
            "faults": [{"kind": kind, "rank": 0, "step": None, "attempt": 0, "params": params, "spec": pid}],
            "fired": [{"event": "fired", "op": event, "when": when, "ord": n, "path": f"{out}/{path}",
                       "rel": path, "rank": 0, "attempt": 0}] if event else [],
            "fault_applied": applied, "verdict": "fail", "outcome": outcome,
            "summary": f"{what}; then {why}" if what else why, "oracles": oracles,
            "replay": f"chaos run --point {pid}{anchor} -- python careless_job.py --out '{{out}}'",
            "error": None, "seconds": 0.25, "scenario": {"kind": "job", "point": f"{pid}{anchor}"}}


def _power(lost: list[dict[str, Any]]) -> dict[str, Any]:
    return {"what": "power loss right after rank 0's event 9: ...", "choice": "mixed state 1", "lost": lost,
            "files_before": ["ckpt.json"], "files_after": ["ckpt.json"]}


def _data(path: str, torn: bool = True) -> dict[str, Any]:
    return {"what": "data", "path": path, "persisted": 24 if torn else 0, "pending": 161, "torn": torn,
            "reason": "file not fsynced"}


def _entry(path: str, op: str = "create") -> dict[str, Any]:
    return {"what": "dir_entry", "op": op, "path": path, "dir": "", "reason": "directory not fsynced"}


JSON_ERRORS = ["json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
               "json.decoder.JSONDecodeError: Expecting ',' delimiter: line 1 column 52 (char 51)",
               "json.decoder.JSONDecodeError: Unterminated string starting at: line 1 column 2 (char 1)"]


def careless_doc() -> dict[str, Any]:
    """The results of a careless job: 30 + 3 points of two in-place files, 9 of four other causes, 6 passes."""
    pts: list[dict[str, Any]] = []
    n = 0

    def add(*args: Any, **kw: Any) -> None:
        nonlocal n
        n += 1
        pts.append(point(*args, n=n, **kw))

    for save in range(1, 5):  # four saves of ckpt.json, each rewriting it in place
        op = 3 * save
        add(f"rank0:op{op - 2}:after", "crash", "after", "open", "ckpt.json", save, "hard_failure", JSON_ERRORS[0])
        add(f"rank0:op{op - 1}:before", "crash", "before", "write", "ckpt.json", save, "hard_failure", JSON_ERRORS[0])
        add(f"rank0:op{op - 1}:torn", "crash", "torn", "write", "ckpt.json", save, "hard_failure", JSON_ERRORS[1])
        add(f"rank0:op{op - 1}:enospc", "ioerror", "enospc", "write", "ckpt.json", save, "hard_failure",
            JSON_ERRORS[0], what=f"rank 0's write of ckpt.json (event {op - 1}) raised ENOSPC",
            applied={"what": "raised ENOSPC", "fired": []})
    for k in range(14):  # power cuts that tore ckpt.json's unsynced data
        add(f"rank0:op{k + 1}:power:s{k % 3 + 1}", "powerloss", None, ["write", "close", "open"][k % 3],
            "ckpt.json", k // 3 + 1, "hard_failure", JSON_ERRORS[k % 3],
            what="power loss right after rank 0's event 9: ckpt.json: 24 of 161 unsynced byte(s) kept, a write torn",
            applied=_power([_data("ckpt.json")]))
    for save in range(1, 4):  # the same defect on a torch file: another file, another cause
        add(f"rank0:op{20 + save}:after", "crash", "after", "open", "model.pt", save, "hard_failure", TORCH)
    for k in range(4):  # a power cut that lost the directory entry: the file is gone, work lost
        add(f"rank0:op{4 + k}:power", "powerloss", None, "close", "ckpt.json", k + 1, "lost_work",
            what="power loss: create of ckpt.json lost (directory not fsynced)",
            applied=_power([_entry("ckpt.json"), _data("ckpt.json", torn=False)]))
    for k in range(2):  # a power cut that lost only data: the file rolled back, work lost
        add(f"rank0:op{8 + k}:power:s1", "powerloss", None, "write", "ckpt.json", k + 2, "lost_work",
            what="power loss: ckpt.json: the last 3 of 4 unsynced change(s) lost",
            applied=_power([_data("ckpt.json", torn=False)]))
    for k in range(2):  # bit rot at rest, loaded as good
        add(f"rank0:op{6 + 3 * k}:bitflip:step{7 + 3 * k}", "corrupt", "bitflip", "close", "ckpt.json", k + 2,
            "silent_divergence", what="ckpt.json: bit 4 of byte 43 flipped at rest",
            applied={"what": "bit flipped", "family": "bitflip", "file": "ckpt.json", "at_step": 7 + 3 * k},
            failing="result_files")
    add("rank1:step3:net", "netcut", None, None, None, None, "hard_failure",
        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4321",
        what="rank 1's link down at its step 3 for a 5 s hold")
    for k in range(6):
        sc = point(f"rank0:step{k + 1}:kill", "kill", "kill", None, None, None, "hard_failure", n=90 + k)
        sc.update(verdict="pass", outcome="pass", summary="the job finished after 1 restart(s)")
        sc["oracles"] = {"liveness": {"result": "pass", "summary": "the job finished", "evidence": {}}}
        pts.append(sc)
    skipped = copy.deepcopy(pts[-1])
    skipped.update(id="rank0:op30:power", verdict="skipped", outcome="no_effect", summary="the cut lost nothing")
    pts.append(skipped)
    spec = {"command": COMMAND, "resume_command": None, "ranks": None, "world_size": 1, "torchrun": False,
            "result_files": [], "max_restarts": 1, "timeout_s": 300.0, "rtol": 0.001, "cwd": str(REPO)}
    return {"schema_version": 1, "summary": {"pass": 6, "fail": len(pts) - 7, "error": 0, "skipped": 1,
                                             "total": len(pts)},
            "environment": {"chaos": "0.1.0"},
            "job": {"spec": spec, "outcomes": {}, "points_found": 160, "points_chosen": len(pts),
                    "points_tried": len(pts), "coverage": 0.3, "budget_s": None, "seconds": 12.0},
            "scenarios": pts}


@pytest.fixture
def doc() -> dict[str, Any]:
    return careless_doc()


def _by_kind(causes: list) -> dict[tuple[str, str], Any]:
    return {(c.kind, c.file): c for c in causes}


def test_thirty_points_of_one_defect_are_one_cause_with_its_fix_and_a_representative(doc):
    causes = group(doc)
    assert [(c.outcome, c.kind, c.file, c.count) for c in causes] == [
        ("hard_failure", "in_place", "ckpt.json", 30),
        ("hard_failure", "in_place", "model.pt", 3),
        ("hard_failure", "unknown", "", 1),
        ("silent_divergence", "no_checksum", "ckpt.json", 2),
        ("lost_work", "dir_not_fsynced", "ckpt.json", 4),
        ("lost_work", "data_not_fsynced", "ckpt.json", 2),
    ]
    ckpt = causes[0]
    assert ckpt.title == "ckpt.json is written in place" and ckpt.fix == IN_PLACE_FIX
    assert ckpt.families() == [("kill", 12), ("power", 14), ("errno", 4)]
    # the representative: the commonest failure, shown by a plain kill (nothing else to set up)
    assert ckpt.representative.id == "rank0:op1:after"
    assert ckpt.signatures()[0] == ("json.decoder.JSONDecodeError: Expecting value: line N column N (char N)", 17)
    assert len({c.id for c in causes}) == len(causes)
    assert ckpt.id == "hard_failure:in_place:ckpt.json:parse_error"  # no count, no point id: stable across runs


def test_a_power_cut_that_lost_the_directory_entry_and_one_that_lost_data_are_different_causes(doc):
    causes = _by_kind(group(doc))
    entry, data = causes[("dir_not_fsynced", "ckpt.json")], causes[("data_not_fsynced", "ckpt.json")]
    assert entry.title == "no fsync of the directory: the create of ckpt.json can be lost"
    assert entry.fix.startswith("a power cut can erase a completed save — fsync the directory")
    assert data.fix.startswith("a power cut leaves it empty, torn or older") and "fsync the file" in data.fix
    assert entry.where() == [("create of ckpt.json lost (directory not fsynced)", 4)]
    rot = causes[("no_checksum", "ckpt.json")]
    assert rot.title == "no checksum on ckpt.json"
    assert rot.fix == ("bit rot loads as good — store a hash and verify on load, fall back to the previous "
                       "checkpoint")


def test_without_fault_records_the_anchored_point_ids_give_the_same_causes(doc):
    """An older or trimmed document: ``rank0:op1:after@open:ckpt.json:1`` says the family and the site."""
    want = [(c.id, c.count) for c in group(doc)]
    for sc in doc["scenarios"]:
        del sc["faults"]
    assert [(c.id, c.count) for c in group(doc)] == want


def test_an_unknown_kind_gets_no_invented_fix(doc):
    (net,) = [c for c in group(doc) if c.kind == "unknown"]
    assert net.fix is None and net.fix_text == NO_FIX
    assert net.title == "the resume fails after a network cut"
    assert all(k.fix for k in KINDS.values())


def test_the_whole_last_line_of_an_exception_is_kept(doc):
    """The verdict line keeps 200 characters of torch's message (cut mid-word); the cause keeps it all."""
    model = _by_kind(group(doc))[("in_place", "model.pt")]
    rep = model.representative
    assert TORCH[:200] in rep.scenario["summary"] and TORCH not in rep.scenario["summary"]
    assert rep.summary().endswith(TORCH)
    assert model.signatures() == [("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
                                   "central directory. This is an internal miniz error. If you are seeing this "
                                   "error, please report it to the PyTorch maintainers with the file that caused "
                                   "it: {out}/model.pt (archive of N bytes)", 3)]
    lines = console_lines(doc)
    assert any(line.endswith(TORCH) for line in lines)
    assert not any("…" in line for line in lines)


def test_a_cell_cuts_a_long_message_between_words():
    """Where a table cell must be short (the summary's per-point rows, the findings table), a message
    is cut after a whole word; only a single token longer than the cell is cut inside it."""
    from reports.cases import one_line

    cut = one_line(TORCH, 150)
    assert cut.endswith("…") and len(cut) <= 150
    assert cut[:-1].split()[-1] in TORCH.split() and TORCH.startswith(cut[:-1])
    assert one_line("y" * 400, 20) == "y" * 19 + "…"


def test_the_console_prints_one_block_per_cause(doc):
    lines = console_lines(doc)
    assert lines[0] == "42 failing point(s), 6 cause(s):"
    heads = [line for line in lines if not line.startswith(" ")][1:]
    assert heads == ["HARD_FAILURE, 30 point(s): ckpt.json is written in place",
                     "HARD_FAILURE, 3 point(s): model.pt is written in place",
                     "HARD_FAILURE, 1 point(s): the resume fails after a network cut",
                     "SILENT_DIVERGENCE, 2 point(s): no checksum on ckpt.json",
                     "LOST_WORK, 4 point(s): no fsync of the directory: the create of ckpt.json can be lost",
                     "LOST_WORK, 2 point(s): the data of ckpt.json is not fsynced"]
    block = lines[1:lines.index(heads[1])]
    assert block[1] == f"  fix: {IN_PLACE_FIX}"
    assert block[2] == "  covers: kill 12, power 14, errno 4"
    assert block[5].startswith("  e.g. rank0:op1:after (kill after open of ckpt.json): the resume exited 1")
    assert block[6] == ("    replay: chaos run --point rank0:op1:after@open:ckpt.json:1 -- python careless_job.py "
                        "--out '{out}'")
    assert block[7].startswith("  points: rank0:op1:after, rank0:op1:power:s1, rank0:op2:before, ") and block[7].endswith(" and 22 more")
    assert f"  fix: {NO_FIX}" in lines


def test_console_lines_escape_control_characters(doc):
    sc = doc["scenarios"][0]
    sc["id"] = "rank0:op1:after\x1b]0;pwned\x07"
    sc["oracles"]["liveness"]["evidence"]["output_tail"] = "ValueError: \x1b[2J\u202eall points passed\n"
    text = "\n".join(console_lines(doc))
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", text)
    assert "\\u001b]0;pwned\\u0007" in text


def test_junit_has_one_testcase_per_cause_with_its_points_as_properties(doc, tmp_path):
    path = write_junit(doc, tmp_path / "junit.xml")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (6 + 6 + 1, 6, 0, 1)
    cases = {c.name: c for c in suite}
    causes = group(doc)
    ckpt = cases["hard_failure:in_place:ckpt.json:parse_error"]
    assert ckpt.classname == "job"
    (failure,) = ckpt.result
    assert failure.message == f"HARD_FAILURE, 30 point(s): ckpt.json is written in place: {IN_PLACE_FIX}"
    assert failure.type == "hard_failure"
    assert "replay: chaos run --point rank0:op1:after@open:ckpt.json:1" in failure.text
    props = {p.name: p.value for p in ckpt.child(junitparser.Properties)}
    replays = {p.id: p.replay for p in causes[0].points}
    assert {k: v for k, v in props.items() if not k.startswith("chaos.")} == replays
    assert props["chaos.cause.kind"] == "in_place" and props["chaos.cause.points"] == "30"
    assert cases["rank0:step1:kill"].is_passed and cases["rank0:op30:power"].is_skipped
    assert not any(c.id in cases for c in causes[0].points)  # no testcase per failing point


def test_junit_stays_well_formed_with_hostile_ids(doc):
    doc["scenarios"][0]["id"] = 'rank0:op1:after"/><evil a="\x00\x1b'
    doc["scenarios"][0]["faults"][0]["params"]["path"] = "ckpt.json\x07<b>"
    root = ET.fromstring(ET.tostring(junit_tree(doc).getroot(), encoding="unicode"))
    names = [p.get("name") for p in root.iter("property")]
    assert 'rank0:op1:after"/><evil a="\\u0000\x1b'.replace("\x1b", "\\u001b") in names


def test_the_summary_has_the_cause_table_and_a_block_per_cause(doc):
    text = markdown_summary(doc)
    assert "### Failures by cause" in text and "42 failing point(s), 6 cause(s)" in text
    rows = text.split("| cause | outcome | points | families | fix |\n|---|---|---:|---|---|\n")[1].split("\n\n")[0]
    assert rows.splitlines()[0] == (f"| ckpt.json is written in place | hard\\_failure | 30 | kill 12, power 14, errno 4 "
                                    f"| {IN_PLACE_FIX} |")
    assert len(rows.splitlines()) == 6
    assert text.count("<details><summary>❌ ") == 6
    assert "- **replay:** `chaos run --point rank0:op1:after@open:ckpt.json:1 -- python careless_job.py " in text
    assert "- **points (30):** `rank0:op1:after`, `rank0:op1:power:s1`, `rank0:op2:before`," in text
    # failing points are listed under their cause, not one row each; the skipped one keeps its row
    assert "| `rank0:op2:torn` |" not in text and "| `rank0:op30:power` | job | ⏭️ skipped" in text
    assert TORCH in text  # the representative's verdict line, whole


def test_the_html_report_opens_with_the_causes(doc):
    page = render_html(doc, plotly_js="inline")
    assert page.index('id="causes"') < page.index('id="summary"') < page.index('id="scenarios"')
    blocks = re.findall(r'<div class="cause" id="cause-\d+" data-cause="([^"]+)">', page)
    assert blocks == [html.escape(c.id) for c in group(doc)]
    body = html.unescape(page)
    assert f"Fix:</b> {IN_PLACE_FIX}" in body and f"Fix:</b> {NO_FIX}" in body
    first = page[page.index('id="cause-0"'):page.index('id="cause-1"')]
    assert len(re.findall(r'<li><a href="#s\d+" data-open="s\d+">', first)) == 30
    # only each cause's representative is open among the failing scenarios
    opened = re.findall(r'<details class="scenario fail" id="s(\d+)" open', page)
    assert sorted(int(i) for i in opened) == sorted(c.representative.index for c in group(doc))


def test_other_documents_are_not_grouped():
    builtin = json.loads((REPO / "tests" / "fixtures" / "report" / "results-fail.json").read_text())
    assert group(builtin) == [] and console_lines(builtin) == []
    assert "Failures by cause" not in markdown_summary(builtin)


def test_a_real_careless_run_prints_one_block_for_its_in_place_checkpoint(tmp_path):
    """The careless example (about 5 s): every kill, ENOSPC and torn power cut that fails the resume
    lands in one cause, whose block names the fix; JUnit counts causes, not points."""
    results, junit = tmp_path / "r.json", tmp_path / "j.xml"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--faults",
                           "kill,errno,power", "--max-points", "40", "--seed", "0", "--json", str(results),
                           "--junit", str(junit), "--", sys.executable, "chaos/examples/careless_job.py", "--out",
                           "{out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    torn = [s for s in doc["scenarios"] if s["outcome"] == "hard_failure"]
    assert len(torn) > 3
    causes = group(doc)
    (in_place,) = [c for c in causes if c.outcome == "hard_failure"]
    assert (in_place.kind, in_place.file, in_place.count) == ("in_place", "ckpt.json", len(torn))
    assert {f for f, _ in in_place.families()} >= {"kill", "errno"}
    lines = console_lines(doc)
    assert sum(1 for line in lines if line.startswith("HARD_FAILURE")) == 1
    assert f"  fix: {IN_PLACE_FIX}" in lines
    printed = proc.stdout.splitlines()  # what `chaos run` itself printed: the same blocks, one replay per cause
    assert sum(1 for line in printed if line.startswith("HARD_FAILURE, ")) == 1, proc.stdout
    assert f"  fix: {IN_PLACE_FIX}" in printed
    assert sum(1 for line in printed if line.lstrip().startswith("replay:")) == len(causes)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert int(suite.get("failures")) == len(causes) < sum(1 for s in doc["scenarios"] if s["verdict"] == "fail")


def test_every_job_fault_family_has_its_words_and_its_place_in_every_table() -> None:
    """A family added to the contract (sched, reorder) must be named in the cause tables and in the
    findings table, or its failures read as an unknown kind."""
    from chaos.cli import findings
    from chaos.model.jobspec import FAULT_KINDS, parse_point
    from reports import causes

    for kind in FAULT_KINDS:
        assert kind in causes._FAMILY_WORDS and kind in findings.FAMILY_WORDS, kind
        assert kind in causes.REPRESENTATIVE_ORDER, kind
    for text, kind in (("rank0:step5:requeue", "sched"), ("rank0:op1:requeue", "sched"), ("rank0:step3:preempt", "sched"),
                       ("rank0:step5:node", "sched"), ("rank0:op9:reorder", "reorder"), ("rank1:step5:net", "net"),
                       ("rank0:op9:stale", "stale"), ("rank1:op4:swap", "swap"), ("rank0:op9:payload", "payload")):
        point = parse_point(text)
        assert point.family == kind
        assert causes.FAMILY[point.to_fault()["kind"]] == kind, text
        assert causes.FAMILY[causes._from_id(text, text)[0]] == kind, text


def test_a_slurm_requeue_mid_save_joins_the_in_place_cause_of_the_kills_at_that_file(doc):
    """A requeue right after the open that truncates ckpt.json leaves what a kill there leaves: the same
    cause, its fix, one more point; a requeue between saves that lost work is the kill's cause too."""
    doc["scenarios"].append(point("rank0:op1:requeue", "sched", "requeue", "open", "ckpt.json", 1, "hard_failure",
                                  JSON_ERRORS[0], what="Slurm job 3 requeued at rank 0's event 1 (open of ckpt.json)",
                                  n=200))
    doc["scenarios"].append(point("rank0:step5:preempt", "sched", "preempt", None, None, None, "lost_work",
                                  what="Slurm job 4 preempted (SIGTERM, then requeued) at rank 0's step 5", n=201))
    causes = _by_kind(group(doc))
    in_place = causes[("in_place", "ckpt.json")]
    assert "rank0:op1:requeue" in in_place.ids() and in_place.fix == IN_PLACE_FIX
    assert dict(in_place.families())["sched"] == 1
    lost = [c for c in causes.values() if "rank0:step5:preempt" in c.ids()]
    assert len(lost) == 1 and lost[0].kind == "ignores_newest"
    requeue = next(p for p in in_place.points if p.id == "rank0:op1:requeue")
    assert requeue.landed == "Slurm requeue after open of ckpt.json"


def test_a_kill_at_a_step_a_phase_or_struck_again_in_its_resume_says_where_it_landed(doc):
    """A step kill's fired record names the step, not a file event: it landed between saves (it
    read "kill (kill) step of " before); a phase kill names its phase; a point struck again inside
    its resume says so, and is a cause of its own beside the single kills."""
    step = point("rank0:step5:kill", "kill", "kill", None, None, None, "lost_work", n=300)
    step["fired"] = [{"event": "fired", "op": "step", "when": "kill", "step_n": 5, "rank": 0, "attempt": 0}]
    phase = point("rank0:step4:kill,phase=commit", "kill", "kill", None, None, None, "lost_work", n=301)
    phase["faults"][0]["params"]["phase"] = "commit"
    phase["fired"] = [{"event": "fired", "op": "phase", "phase": "commit", "rank": 0, "attempt": 0}]
    again = point("rank0:step5:kill+rank0:op1:after", "kill", "kill", None, None, None, "lost_work", n=302)
    again["fired"] = step["fired"]
    again["faults"].append({"kind": "crash", "rank": 0, "step": None, "attempt": 1, "spec": "rank0:op1:after",
                            "params": {"op": 1, "when": "after"}})
    doc["scenarios"] += [step, phase, again]
    causes = group(doc)
    landed = {p.id: p.landed for c in causes for p in c.points}
    [recovery] = [c for c in causes if "rank0:step5:kill+rank0:op1:after" in c.ids()]
    assert recovery.ids() == ["rank0:step5:kill+rank0:op1:after"] and recovery.kind == "recovery_unsafe"
    assert "crash inside the resume's own recovery" in recovery.title and "not crash-safe" in recovery.fix_text
    assert landed["rank0:step5:kill"] == "kill between saves"
    assert landed["rank0:step4:kill,phase=commit"] == "kill at the commit phase of a save"
    assert landed["rank0:step5:kill+rank0:op1:after"] == "kill between saves; then a kill inside its restart"
    assert "at: kill (kill)" not in "\n".join(console_lines(doc))
