"""``chaos repro RESULTS.json``: from a real job run's failing point, a reproduction script that
reproduces it when run on its own, and an issue draft with no local path in it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

from chaos.cli import repro
from chaos.errors import ConfigError
from chaos.target.job.script import FRAMEWORKS, job_imports, job_script

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "chaos" / "examples" / "careless_job.py"


def _chaos(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def job_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real ``chaos run -- python careless_job.py --out {out}`` (kills only, 4 sampled points),
    in a directory of its own: the careless job's in-place save fails at one of them."""
    root = tmp_path_factory.mktemp("repro")
    work = root / "work"
    work.mkdir()
    shutil.copy(EXAMPLE, work / "careless_job.py")
    results = root / "R.json"
    proc = _chaos("run", "--faults", "kill", "--max-points", "4", "--seed", "0", "--scratch", str(root),
                  "--json", str(results), "--", sys.executable, "careless_job.py", "--out", "{out}", cwd=work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    verdicts = {s["verdict"] for s in doc["scenarios"]}
    assert verdicts == {"pass", "fail"}, verdicts  # both kinds, for --point of a passing one
    return {"root": root, "work": work, "results": results, "doc": doc}


def _failing(doc: dict) -> list[dict]:
    return [s for s in doc["scenarios"] if s["verdict"] == "fail"]


def test_find_picks_the_first_failing_point_with_its_recorded_spec(job_run):
    doc = job_run["doc"]
    found = repro.find(doc, "R.json")
    first = _failing(doc)[0]
    # what --point takes: the id with the anchor the run recorded (the job's paths are the same every run)
    anchored = first["scenario"]["point"]
    assert anchored.startswith(first["id"] + "@") and first["faults"][0]["params"]["path"] in anchored
    assert (found.point, found.outcome, found.summary) == (first["id"], "hard_failure", first["summary"])
    assert found.spec.cwd == str(job_run["work"]) and found.spec.command[1:] == ("careless_job.py", "--out", "{out}")
    assert found.rerun_args()[-4:] == ["--seed", "0", "--point", anchored] and found.point_arg == anchored
    assert repro.find(doc, "R.json", first["id"]).point_arg == anchored
    # results written before anchors existed: the bare id
    old = {**doc, "scenarios": [{**s, "scenario": {**s["scenario"], "point": s["id"]}} for s in doc["scenarios"]]}
    assert repro.find(old, "R.json").rerun_args()[-1] == first["id"]


def test_find_refuses_what_it_cannot_reproduce_naming_the_file(job_run):
    doc = job_run["doc"]
    failing = ", ".join(s["id"] for s in _failing(doc))
    passing = next(s["id"] for s in doc["scenarios"] if s["verdict"] == "pass")
    with pytest.raises(ConfigError, match=re.escape(f"R.json has no point rank9:op1:before; its failing points: "
                                                    f"{failing}")):
        repro.find(doc, "R.json", "rank9:op1:before")
    with pytest.raises(ConfigError, match=re.escape(f"R.json: point {passing} did not fail (verdict pass, outcome "
                                                    f"pass); its failing points: {failing}")):
        repro.find(doc, "R.json", passing)
    held = {**doc, "scenarios": [{**s, "verdict": "pass"} for s in doc["scenarios"]]}
    with pytest.raises(ConfigError, match=r"R.json has no failing point to reproduce \(4 pass\)"):
        repro.find(held, "R.json")
    builtin = {"schema_version": 1, "scenarios": [{"id": "kill-1", "verdict": "fail"}]}
    with pytest.raises(ConfigError, match="R.json is not the results of a job run"):
        repro.find(builtin, "R.json")
    with pytest.raises(ConfigError, match="R.json is not a chaos results JSON"):
        repro.find([1, 2], "R.json")
    broken = {**doc, "job": {"spec": {"command": ["python", "x.py"]}}}  # no {out}: not a spec chaos run wrote
    with pytest.raises(ConfigError, match="R.json: the recorded job spec is not one chaos run wrote"):
        repro.find(broken, "R.json")


def _local_roots(job_run) -> list[str]:
    return [str(job_run["root"]), str(job_run["work"]), str(Path.home()), sys.prefix, sys.base_prefix,
            tempfile.gettempdir(), str(REPO)]


def test_the_issue_draft_says_what_was_done_expected_observed_versions_and_output(job_run):
    found = repro.find(job_run["doc"], str(job_run["results"]))
    script = job_script(found.spec)
    assert script is not None and script.path == job_run["work"] / "careless_job.py"
    text = repro.issue_markdown(found, repro.versions(found, script), repro.Scrubber.for_finding(found), script,
                                "careless_job.py")
    fault = found.entry["faults"][0]["params"]
    assert text.startswith(f"# careless_job.py: resume fails after a kill {'right after' if fault['when'] == 'after' else ''}")
    for heading in ("## What was done", "## Expected", "## Observed", "## How to reproduce", "## Versions",
                    "## Output (trimmed)"):
        assert f"\n{heading}\n" in text
    assert f"of `<out>/{fault['path']}` (traced file event {fault['op']})" in text
    assert f"point `{found.point}`" in text and "**hard failure**" in text
    python = Path(sys.executable).name  # python, or python3 under a venv's own pytest script
    assert f"--seed 0 --point {found.point_arg} -- <venv>/bin/{python} careless_job.py --out '{{out}}'" in text
    assert f"- python: {found.environment['python']}\n- torch: {metadata.version('torch')}\n" in text
    assert f"- chaos-ckpt (the harness): {metadata.version('chaos-ckpt')}" in text
    assert 'File "<cwd>/careless_job.py"' in text and "json.decoder.JSONDecodeError: " in text
    output = text.split("## Output (trimmed)")[1]
    assert len(output.splitlines()) <= repro.OUTPUT_LINES + 10
    for root in _local_roots(job_run):
        assert root not in text, root


def test_the_scrubber_replaces_every_local_path_and_keeps_urls_and_system_paths(tmp_path):
    found = repro.Finding("R.json", "rank0:op1:after", 0, "hard_failure", "", repro.JobSpec(
        command=(f"{tmp_path}/venv/bin/python", "train.py", "{out}"), cwd=str(tmp_path / "work")), {}, {})
    scrub = repro.Scrubber.for_finding(found)
    text = (f"{tmp_path}/chaos-job-ab_12/point-00003/out/ckpt.json and {tmp_path}/chaos-job-ab_12/golden-0/tmp/x "
            f"in {tmp_path}/chaos-job-ab_12; cwd {tmp_path}/work/train.py; venv {tmp_path}/venv/lib/site.py; "
            f"home {Path.home()}/.cache/x; python {sys.base_prefix}/lib/json.py; other /srv/data/run7/file.bin; "
            "system /usr/lib/libc.so; see https://github.com/huggingface/transformers/issues/35525 step 1/49")
    got = scrub.scrub(text)
    assert got == ("<out>/ckpt.json and <tmp>/x in <scratch>; cwd <cwd>/train.py; venv <venv>/lib/site.py; "
                   "home <home>/.cache/x; python <python>/lib/json.py; other <path>/file.bin; "
                   "system /usr/lib/libc.so; see https://github.com/huggingface/transformers/issues/35525 step 1/49")


def test_versions_are_the_packages_the_job_imports(tmp_path):
    job = tmp_path / "train.py"
    job.write_text("import json, os\nimport torch.nn as nn\nfrom rich.console import Console\nfrom . import sib\n"
                   "from chaos import probe\n")
    assert job_imports(job) == ["json", "os", "torch", "rich", "chaos"]
    found = repro.Finding("R.json", "p", 0, "hard_failure", "", repro.JobSpec(command=("python", "train.py", "{out}"),
                          cwd=str(tmp_path)), {}, {"python": "3.11.7", "torch": "2.13.0+cpu", "chaos": "0.1.0",
                                                   "platform": "Linux-x"})
    got = repro.versions(found, job_script(found.spec))
    assert got == [("python", "3.11.7"), ("torch", "2.13.0+cpu"), ("rich", metadata.version("rich")),
                   ("chaos-ckpt (the harness)", "0.1.0"), ("platform", "Linux-x")]
    installed = []
    for dist in FRAMEWORKS:
        try:
            installed.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            pass
    assert repro.versions(found, None)[2:-2] == installed  # no readable script: the frameworks installed


def test_the_repro_script_is_python_with_the_point_command_and_cwd_embedded(job_run):
    found = repro.find(job_run["doc"], "R.json")
    text = repro.repro_script(found, sys.executable, job_script(found.spec), "careless_job.py")
    compile(text, "repro.py", "exec")
    assert f"POINT = {found.point!r}" in text and f"CWD = {str(job_run['work'])!r}" in text
    assert f"POINT_ARG = {found.point_arg!r}" in text and found.point_arg.startswith(found.point + "@")
    assert f"COMMAND = {list(found.spec.command)!r}" in text and "JOB_SCRIPT = (1, 'careless_job.py')" in text
    assert "EXPECTED = 'hard_failure'" in text and "OPTIONS = ['--faults', 'kill']" in text


def test_a_bare_python_is_pinned_to_the_interpreter_the_job_ran_with(job_run, tmp_path, monkeypatch):
    # The job was `python careless_job.py` with the venv's bin first on PATH; elsewhere `python` may
    # name a Python without torch or the job's packages: the repro runs the recorded one.
    found = repro.find(job_run["doc"], "R.json")
    spec = dataclasses.replace(found.spec, command=("python", *found.spec.command[1:]))
    venv_bin = tmp_path / "venv-bin"
    venv_bin.mkdir()
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}{os.environ['PATH']}")
    text = repro.repro_script(dataclasses.replace(found, spec=spec), sys.executable)
    assert f"JOB_PYTHON = {str(venv_bin / 'python')!r}" in text  # the link itself, not its target
    other_bin = tmp_path / "other-bin"
    other_bin.mkdir()
    (other_bin / "python").symlink_to("/bin/true")
    monkeypatch.setenv("PATH", f"{other_bin}{os.pathsep}{os.environ['PATH']}")
    namespace: dict = {"__file__": str(tmp_path / "repro.py"), "__name__": "repro_under_test"}
    exec(compile(text, "repro.py", "exec"), namespace)
    _cwd, command = namespace["job_command"](False)
    assert command[0] == str(venv_bin / "python")
    assert repro.repro_script(found, sys.executable).count("JOB_PYTHON = None") == 1  # an absolute path stays


def _run_repro(directory: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(directory / "repro.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_chaos_repro_output_reproduces_the_finding_on_its_own(job_run, tmp_path):
    out = tmp_path / "finding"
    made = _chaos("repro", str(job_run["results"]), "--out", str(out), cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    point = _failing(job_run["doc"])[0]["id"]
    assert made.stdout.startswith(f"HARD_FAILURE {point}: the resume exited 1")
    assert f"job script copied: {out / 'careless_job.py'}" in made.stdout
    assert sorted(p.name for p in out.iterdir()) == ["careless_job.py", "issue.md", "repro.py"]
    assert (out / "careless_job.py").read_bytes() == EXAMPLE.read_bytes()
    issue = (out / "issue.md").read_text()
    assert "## Versions" in issue and f"- torch: {metadata.version('torch')}" in issue
    for root in [*_local_roots(job_run), str(tmp_path)]:
        assert root not in issue, root

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = _run_repro(out, "--scratch", str(tmp_path), cwd=elsewhere)  # from anywhere, in the recorded cwd
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"repro: in {job_run['work']}: chaos run --faults kill --seed 0 --point {point}" in again.stdout
    assert f"repro: REPRODUCED {point}: hard_failure again: the resume exited 1" in again.stdout

    moved = job_run["root"] / "work-moved"
    os.rename(job_run["work"], moved)  # the job's own directory is gone: the copied script stands in
    try:
        alone = _run_repro(out, "--scratch", str(tmp_path), cwd=elsewhere)
    finally:
        os.rename(moved, job_run["work"])
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "or its job script is gone: running the copy beside this file" in alone.stdout
    assert f"repro: REPRODUCED {point}: hard_failure again" in alone.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "finding"]  # scratch roots removed


def test_a_repro_whose_outcome_does_not_come_back_exits_1(job_run, tmp_path):
    doc = json.loads(job_run["results"].read_text())
    first = _failing(doc)[0]
    first["outcome"] = "silent_divergence"  # what the script will expect; the rerun says hard_failure
    results = tmp_path / "tampered.json"
    results.write_text(json.dumps(doc))
    assert _chaos("repro", str(results), "--out", str(tmp_path / "d"), cwd=tmp_path).returncode == 0
    got = _run_repro(tmp_path / "d", "--here", "--scratch", str(tmp_path), cwd=tmp_path)
    assert got.returncode == 1, got.stdout + got.stderr
    assert (f"repro: NOT REPRODUCED {first['id']}: expected silent_divergence, got hard_failure (fail)"
            in got.stdout)


def test_chaos_repro_bad_input_is_one_error_line(job_run, tmp_path, capsys):
    from chaos.cli.main import main

    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "builtin.json").write_text(json.dumps({"schema_version": 1, "scenarios": []}))
    shutil.copy(job_run["results"], tmp_path / "R.json")
    cases = [(["repro", str(tmp_path / "missing.json")], f"results file not found: {tmp_path / 'missing.json'}"),
             (["repro", str(tmp_path / "bad.json")], f"{tmp_path / 'bad.json'} is not valid JSON"),
             (["repro", str(tmp_path / "builtin.json")], f"{tmp_path / 'builtin.json'} is not the results of a job run"),
             (["repro", str(tmp_path / "R.json"), "--point", "disk:full:1"],
              f"{tmp_path / 'R.json'} has no point disk:full:1; its failing points: ")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"chaos: error: {message}"), err
    assert main(["repro", str(tmp_path / "R.json")]) == 0  # default --out: beside the results
    point = _failing(job_run["doc"])[0]["id"]
    assert (tmp_path / f"repro-{point.replace(':', '-')}" / "repro.py").is_file()


def _net_doc(tmp_path: Path, point: str, ended: list[str], causes: dict[int, str]) -> dict:
    """A results document with one failing net point, its fault and launcher record made by the
    harness's own functions (``Point.to_fault``, ``netcut.cut``'s fields, ``netcut.finish`` and
    ``describe``), as ``chaos run --ranks 2 --faults net --json`` writes them."""
    from chaos.model.jobspec import JobSpec, parse_point
    from chaos.nemesis import netcut

    (tmp_path / "train.py").write_text("import torch\n")
    p = parse_point(point)
    if p.step is None:
        p = type(p)(p.rank, p.mode, op=p.op, kind="rename", path="checkpoints/checkpoint_1", seq=40, nth=2)
    spec = JobSpec(command=("python", "train.py", "--out", "{out}"), cwd=str(tmp_path), ranks=2,
                   faults=("net",), net_hold_s=3.0)
    net = {"rank": p.rank, "step": p.step, "ord": p.op, "op": p.kind, "path": p.path, "hold_s": 3.0,
           "side": "host", "down": {"action": "link_down", "ts": 10.0}, "up": {"action": "link_up", "ts": 13.1}}
    codes = {"killed_after_hold": -9, "raised": 1, "stopped": -9, "exited_0": 0}
    netcut.finish(net, [codes[e] for e in ended], [i for i, e in enumerate(ended) if e in ("killed_after_hold",
                  "stopped")], causes, held_out="killed_after_hold" in ended, timed_out=False)
    what = netcut.describe(net)
    entry = {"id": point, "seed": 0, "verdict": "fail", "outcome": "hard_failure",
             "summary": f"{what}; then the resume exited 1 (FileNotFoundError: {tmp_path}/o/checkpoints/x.bin)",
             "faults": [p.to_fault(hold_s=3.0)], "fault_applied": {"what": what, **net},
             "oracles": {"liveness": {"result": "fail", "summary": "the resume exited 1",
                                      "evidence": {"output_tail": "Traceback\nFileNotFoundError: x.bin"}}},
             "attempts": [{"attempt": 0, "outcome": what}, {"attempt": 1, "outcome": "exited 1"}]}
    return {"schema_version": 1, "job": {"spec": spec.to_dict()}, "scenarios": [entry],
            "environment": {"python": "3.11.7", "torch": "2.13.0+cpu"}}


def test_a_net_point_is_worded_as_a_network_cut_of_a_rank(tmp_path):
    """``rank1:op12:net`` / ``rank0:step6:net`` (pointset's net ids): the draft says whose link was cut,
    where, for how long, how each rank ended and that the link came back, and that the rerun needs root."""
    found = repro.find(_net_doc(tmp_path, "rank1:op12:net", ["killed_after_hold", "killed_after_hold"], {}), "R.json")
    fault = repro.describe_fault(found)
    assert fault == ("rank 1's network link was cut right after its 2nd `rename` of `<out>/checkpoints/checkpoint_1` "
                     "(traced file event 12) and kept down for 3 s while the job went on (every packet to or from "
                     "that rank dropped, as with a pulled cable: each rank runs in a network namespace of its own): "
                     "every rank was still running, blocked, when the hold ended and was killed (SIGKILL); the link "
                     "was back up before the restart; then the harness restarted the job (at most 1 restart(s))")
    script = job_script(found.spec)
    text = repro.issue_markdown(found, repro.versions(found, script), repro.Scrubber.for_finding(found), script)
    assert text.startswith("# train.py: resume fails after a network cut right after rename of "
                           "checkpoints/checkpoint_1\n")
    assert f"- {fault}.\n" in text and "point `rank1:op12:net`" in text
    assert "\n## Observed\n\nThe resume exited 1 (FileNotFoundError: <cwd>/o/checkpoints/x.bin).\n" in text  # once
    assert "\n## How to reproduce\n\nThe network cut needs root and iproute2" in text
    assert "chaos run --ranks 2 --faults net --net-hold 3.0 --seed 0 --point rank1:op12:net -- python train.py" in text
    assert str(tmp_path) not in text

    mixed = repro.find(_net_doc(tmp_path, "rank0:step6:net", ["raised", "stopped"],
                                {0: "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"}),
                       "R.json")
    assert repro.describe_fault(mixed).startswith(
        "rank 0's network link was cut at training step 6 and kept down for 3 s")
    assert (": rank 0 raised `RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer`; rank 1 "
            "was stopped by the harness once another rank had failed; the link was back up") in repro.describe_fault(mixed)
    assert repro.title(mixed, job_script(mixed.spec), []) == "train.py: resume fails after a network cut at step 6"


def test_a_kill_point_draft_does_not_mention_the_network(job_run):
    found = repro.find(job_run["doc"], "R.json")
    text = repro.issue_markdown(found, repro.versions(found, None), repro.Scrubber.for_finding(found))
    assert "network" not in text


def test_a_repro_the_harness_skips_here_says_so_and_exits_2(job_run, tmp_path):
    """The rerun of a net point where no cut can be made (here: a one-process job, so no ranks to cut
    apart) is skipped by the harness: the script says why and exits 2 (could not run), never 1."""
    doc = json.loads(job_run["results"].read_text())
    first = _failing(doc)[0]
    first["id"] = "rank0:step1:net"
    first["faults"] = [{"kind": "netcut", "rank": 0, "step": 1, "attempt": 0, "params": {"hold_s": 5.0},
                        "spec": "rank0:step1:net"}]
    results = tmp_path / "net.json"
    results.write_text(json.dumps(doc))
    assert _chaos("repro", str(results), "--out", str(tmp_path / "d"), cwd=tmp_path).returncode == 0
    got = _run_repro(tmp_path / "d", "--here", "--scratch", str(tmp_path), cwd=tmp_path)
    assert got.returncode == 2, got.stdout + got.stderr
    assert ("repro: COULD NOT RUN rank0:step1:net here: the harness skipped it: a network cut between ranks cannot "
            "be made here: a network cut between ranks needs at least two") in got.stdout


def test_a_sched_point_says_slurm_restarted_the_job(tmp_path):
    """A job Slurm launched (``--launcher sbatch``) and requeued: the restart was Slurm's, not the harness's."""
    from chaos.model.jobspec import JobSpec, parse_point

    spec = JobSpec(command=(sys.executable, str(tmp_path / "train.py"), "--out", "{out}"), launcher="sbatch",
                   faults=("sched",), cwd=str(tmp_path))
    p = parse_point("rank0:step5:requeue")
    what = "Slurm job 3 requeued at rank 0's step 5 (scontrol requeue 3), Restarts=1"
    entry = {"id": p.id, "seed": 0, "verdict": "fail", "outcome": "hard_failure",
             "summary": f"{what}; then the resume exited 1 (json.decoder.JSONDecodeError: Expecting value)",
             "faults": [p.to_fault()], "fault_applied": {"what": what, "job_id": "3", "restarts": 1},
             "oracles": {"liveness": {"result": "fail", "summary": "the resume exited 1", "evidence": {}}},
             "attempts": [{"attempt": 0, "outcome": what}, {"attempt": 1, "outcome": "exited 1"}]}
    doc = {"schema_version": 1, "job": {"spec": spec.to_dict()}, "scenarios": [entry],
           "environment": {"python": "3.11.7", "torch": "2.13.0+cpu"}}
    fault = repro.describe_fault(repro.find(doc, "R.json"))
    assert fault == f"{what}; then Slurm restarted the job (its own requeue, as in production)"
