"""``stale``, ``swap`` and ``payload``: the at-rest faults a user's job gets as the built-in workload
does (issue #28), each its own ``--faults`` kind, and the ``no_code_execution`` oracle that judges a
job which unpickles its checkpoint.

Real processes and the real CLI throughout, on small pure-Python jobs (a fraction of a second a
point) and one torch job:

- a job that ``pickle.load``s its checkpoint runs the payload planted in it: *code_execution*,
  named before the crash that follows, with the marker's evidence and a replay that reruns it;
  the same job with an unpickler that refuses globals passes, the trace showing it read the file;
  a job that never reads its checkpoint again makes the point *skipped* (the payload tested
  nothing), never passed; a JSON checkpoint gets no payload point and the run says why;
- ``torch.load(weights_only=False)`` runs it, ``weights_only=True`` does not;
- two ranks' files swapped load as each other's: *silent_divergence*, the record naming both;
- an older save's file put in place of a newer one's loads as the newer where the job takes the
  step from the directory's name: *silent_divergence*; a job that checks the step stored in the
  file against the name falls back and passes.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaos.model.jobspec import parse_point
from chaos.nemesis import atrest, stale, swap

REPO = Path(__file__).resolve().parent.parent
STEP = r"step (\d+) "

# Saves {"step", "w"} with pickle every 3 steps as ckpt-<step>.pkl (temp file, fsync, rename); resumes
# from the newest that loads. --safe: an unpickler that refuses every global (what a careful loader
# does); --fresh: never resumes (never reads a checkpoint again).
PICKLE_JOB = """
import argparse, os, pickle, sys

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--steps", type=int, default=9)
ap.add_argument("--safe", action="store_true")
ap.add_argument("--fresh", action="store_true")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)


class Refuse(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def load(path):
    with open(path, "rb") as f:
        return (Refuse(f) if args.safe else pickle.Unpickler(f)).load()


step, w = 0, 1.0
names = [] if args.fresh else os.listdir(args.out)
for _s, name in sorted(((int(n[5:-4]), n) for n in names if n.startswith("ckpt-") and n.endswith(".pkl")),
                       reverse=True):
    try:
        state = load(os.path.join(args.out, name))
        step, w = state["step"], state["w"]
        break
    except Exception as exc:
        print(f"skipping {name}: {exc!r}", file=sys.stderr)
print(f"resumed from step {step}", flush=True)
while step < args.steps:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        tmp = os.path.join(args.out, "tmp.pkl")
        with open(tmp, "wb") as f:
            pickle.dump({"step": step, "w": w}, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(args.out, f"ckpt-{step}.pkl"))
with open(os.path.join(args.out, "final.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""

# Saves {"step", "w"} as JSON in a directory per save, step-<N>/state.json, written in place and
# renamed into place as a directory; resumes from the newest directory. Careless: the step is the
# directory's name. --check: the step stored in the file must equal the name's, else the next older.
DIR_JOB = """
import argparse, json, os, shutil, sys

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--check", action="store_true")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
step, w = 0, 1.0
for n in sorted((int(d[5:]) for d in os.listdir(args.out) if d.startswith("step-") and d[5:].isdigit()),
                reverse=True):
    with open(os.path.join(args.out, f"step-{n}", "state.json")) as f:
        state = json.load(f)
    if args.check and state["step"] != n:
        print(f"step-{n} holds step {state['step']}: skipped", file=sys.stderr)
        continue
    step, w = n, state["w"]
    break
print(f"resumed from step {step}", flush=True)
while step < 9:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        tmp = os.path.join(args.out, "tmp")
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": step, "w": w}, f)
        final = os.path.join(args.out, f"step-{step}")
        if os.path.isdir(final):  # a save skipped on resume is made again
            shutil.rmtree(final)
        os.rename(tmp, final)
with open(os.path.join(args.out, "final.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""

# Two ranks (--ranks 2) each save their own ckpt-r<RANK>.json ({"step", "w"}; temp file, rename) every 3 steps and
# wait until the other rank's file holds that step too (a barrier, as a collective would be): when one
# rank completes a save, the other's file of the save before is always there. Resumes from its file.
RANK_JOB = """
import argparse, json, os, time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
rank = int(os.environ["RANK"])
mine, theirs = (os.path.join(args.out, f"ckpt-r{r}.json") for r in (rank, 1 - rank))


def saved_step(path):
    try:
        with open(path) as f:
            return json.load(f)["step"]
    except (OSError, ValueError, KeyError):
        return -1


step, w = 0, 1.0 + rank
if os.path.exists(mine):
    with open(mine) as f:
        state = json.load(f)
    step, w = state["step"], state["w"]
while step < 9:
    step += 1
    w = w * 0.9 + step * (rank + 1)
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        with open(mine + ".tmp", "w") as f:
            json.dump({"step": step, "w": w}, f)
        os.replace(mine + ".tmp", mine)
        while saved_step(theirs) < step:
            time.sleep(0.002)
with open(os.path.join(args.out, f"final-r{rank}.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""

# RANK_JOB without the barrier, and with ranks that change pace: in the two fault-free runs (the first two
# launches of each rank, counted in --launches) rank 0 takes its time before each save, so rank 1's file of a
# save is always complete first; in every later run rank 1 is the slow one.
LAG_JOB = """
import argparse, json, os, time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--launches", required=True)
args = ap.parse_args()
rank = int(os.environ["RANK"])
mine = os.path.join(args.out, f"ckpt-r{rank}.json")
earlier = sum(name.startswith(f"r{rank}-") for name in os.listdir(args.launches))
open(os.path.join(args.launches, f"r{rank}-{os.getpid()}"), "w").close()
slow = rank == 0 if earlier < 2 else rank == 1
step, w = 0, 1.0 + rank
if os.path.exists(mine):
    with open(mine) as f:
        state = json.load(f)
    step, w = state["step"], state["w"]
while step < 9:
    step += 1
    w = w * 0.9 + step * (rank + 1)
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        if slow:
            time.sleep(0.4)
        with open(mine + ".tmp", "w") as f:
            json.dump({"step": step, "w": w}, f)
        os.replace(mine + ".tmp", mine)
with open(os.path.join(args.out, f"final-r{rank}.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""

# Saves a directory per save, step-<N>/ with model.pkl ({"step", "w"}) and notes.pkl, written in a temp
# directory and renamed into place: one event completes both files. Resumes from the newest
# directory's model.pkl with pickle.load; notes.pkl is never read again.
TWO_FILE_JOB = """
import argparse, os, pickle

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
saves = sorted((int(n[5:]) for n in os.listdir(args.out) if n.startswith("step-")), reverse=True)
step, w = 0, 1.0
if saves:
    with open(os.path.join(args.out, f"step-{saves[0]}", "model.pkl"), "rb") as f:
        state = pickle.load(f)
    step, w = state["step"], state["w"]
while step < 6:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        tmp = os.path.join(args.out, f"tmp-{step}")
        os.makedirs(tmp)
        for name, obj in (("model.pkl", {"step": step, "w": w}), ("notes.pkl", ["saved", step])):
            with open(os.path.join(tmp, name), "wb") as f:
                pickle.dump(obj, f, protocol=4)
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, os.path.join(args.out, f"step-{step}"))
        fd = os.open(args.out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
with open(os.path.join(args.out, "final.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""

# Like LAG_JOB, but in every run after the two fault-free ones rank 1 is fast, removes its file as soon
# as it saved it (it ran ahead and rotated it away) and then stays alive for 8 s: rank 0's partner file
# came and went before rank 0 completed its own.
GONE_JOB = LAG_JOB.replace(
    '        os.replace(mine + ".tmp", mine)\n',
    '        os.replace(mine + ".tmp", mine)\n'
    '        if earlier >= 2 and rank == 1:\n'
    '            os.remove(mine)\n',
).replace(
    'with open(os.path.join(args.out, f"final-r{rank}.txt"), "w") as f:',
    'if earlier >= 2 and rank == 1:\n'
    '    time.sleep(8)\n'
    'with open(os.path.join(args.out, f"final-r{rank}.txt"), "w") as f:',
)

# torch.save a dict every 3 steps over ckpt.pt (temp file, rename); resume with torch.load, weights_only
# as --weights-only says.
TORCH_JOB = """
import argparse, os, torch

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--weights-only", choices=("true", "false"), required=True)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "ckpt.pt")
step, w = 0, torch.ones(4)
if os.path.exists(path):
    state = torch.load(path, weights_only=args.weights_only == "true")
    step, w = state["step"], state["w"]
while step < 6:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {float(w.sum()):.6f}", flush=True)
    if step % 3 == 0:
        torch.save({"step": step, "w": w}, path + ".tmp")
        os.replace(path + ".tmp", path)
torch.save({"w": w}, os.path.join(args.out, "final.pt"))
"""


def job(tmp: Path, name: str, body: str, *args: str) -> list[str]:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path), "--out", "{out}", *args]


def run(tmp: Path, *args: str, name: str = "r.json", timeout: int = 300) -> tuple[subprocess.CompletedProcess,
                                                                                   dict[str, Any]]:
    results = tmp / name
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp), "--json",
                           str(results), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc, json.loads(results.read_text())


def of_kind(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [s for s in doc["scenarios"] if s["faults"][0]["kind"] == kind]


@pytest.mark.parametrize("text", ["rank0:op9:payload", "rank0:op9:stale:step6", "rank1:op4:swap",
                                  "rank1:op4:swap:step8", "rank0:op9:payload=ckpt/step-6/manifest.pkl",
                                  "rank0:op9:stale:step6=ckpt/step-6/shard-r00001.safetensors"])
def test_the_new_point_ids_round_trip_and_name_their_family(text: str) -> None:
    point = parse_point(text)
    assert point.id == text
    assert point.file == (text.partition("=")[2] or None)
    assert point.family == text.split(":")[2].partition("=")[0]
    assert point.to_fault()["kind"] == point.family


def test_a_job_that_unpickles_its_checkpoint_runs_the_planted_payload(tmp_path: Path) -> None:
    cmd = job(tmp_path, "pickle_job.py", PICKLE_JOB)
    proc, doc = run(tmp_path, "--faults", "payload", "--step-regex", STEP, "--result-file", "final.txt", "--",
                    *cmd)
    assert proc.returncode == 1
    points = of_kind(doc, "payload")
    # each save's file, once it is complete and once the job trusts it (a later step announced)
    assert {p["fault_applied"]["file"] for p in points} == {"ckpt-3.pkl", "ckpt-6.pkl", "ckpt-9.pkl"}
    for p in points:
        oracle = p["oracles"]["no_code_execution"]
        assert (p["verdict"], p["outcome"], oracle["result"]) == ("fail", "code_execution", "fail"), p["summary"]
        assert oracle["evidence"]["marker"]["first_seen"] == "attempt 1"
        assert oracle["evidence"]["format"] == "pickle"
        assert "ran the code planted in it" in p["summary"] and "rank 0 opened it" in p["summary"]
    assert doc["job"]["outcomes"] == {"code_execution": len(points)}
    assert "CODE_EXECUTION" in proc.stdout and "torch.load(weights_only=True)" in proc.stdout  # the cause's fix
    # the replay command reruns exactly that point, with the same verdict
    [replay] = [p["replay"] for p in points if p["id"] == "rank0:op10:payload"]
    assert "--point rank0:op10:payload" in replay
    proc2, doc2 = run(tmp_path, *shlex.split(replay.split(" run ", 1)[1]), name="again.json")
    [again] = doc2["scenarios"]
    assert (again["id"], again["outcome"]) == ("rank0:op10:payload", "code_execution")


def test_an_unpickler_that_refuses_globals_passes_and_the_trace_shows_it_read_the_file(tmp_path: Path) -> None:
    cmd = job(tmp_path, "pickle_job.py", PICKLE_JOB, "--safe")
    proc, doc = run(tmp_path, "--faults", "payload", "--step-regex", STEP, "--result-file", "final.txt", "--",
                    *cmd)
    assert proc.returncode == 0, proc.stdout
    points = of_kind(doc, "payload")
    assert len(points) >= 3
    for p in points:
        oracle = p["oracles"]["no_code_execution"]
        assert (p["verdict"], oracle["result"]) == ("pass", "pass"), p["summary"]
        assert oracle["evidence"]["marker"]["exists"] is False
        assert [(o["rank"], o["attempt"]) for o in oracle["evidence"]["opened_after_planting"]] == [(0, 1)]
        assert "opened it again and the loader refused it" in p["summary"]


def test_each_file_a_directory_rename_completed_has_its_own_point_and_its_replay_strikes_that_file(
        tmp_path: Path) -> None:
    """One event (the rename of tmp-3 to step-3) completes step-3/model.pkl and step-3/notes.pkl: each
    file's payload point names its file in its id, and the failing one's replay strikes the same file
    (before, both had the id rank0:opN:payload, and a replay struck whichever the lookup kept)."""
    cmd = job(tmp_path, "two_file_job.py", TWO_FILE_JOB)
    proc, doc = run(tmp_path, "--faults", "payload", "--step-regex", STEP, "--result-file", "final.txt", "--", *cmd)
    points = of_kind(doc, "payload")
    by_file = {p["fault_applied"]["file"]: p for p in points if p["fault_applied"]["file"].startswith("step-3/")}
    assert set(by_file) == {"step-3/model.pkl", "step-3/notes.pkl"}, [p["id"] for p in points]
    model, notes = by_file["step-3/model.pkl"], by_file["step-3/notes.pkl"]
    assert model["id"].endswith("=step-3/model.pkl") and notes["id"].endswith("=step-3/notes.pkl")
    assert len({p["id"] for p in points}) == len(points)
    assert (model["outcome"], notes["outcome"]) == ("code_execution", "no_effect"), (model["summary"],
                                                                                     notes["summary"])
    assert f"--point {model['id']} " in model["replay"]
    replayed = tmp_path / "replayed"
    replayed.mkdir()
    again = subprocess.run([sys.executable, "-m", "chaos.cli.main", "replay", str(tmp_path / "r.json"), "--yes",
                            "--scenario", model["id"], "--scratch", str(replayed), "--json", str(replayed / "r.json")],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1, again.stdout + again.stderr
    [point] = json.loads((replayed / "r.json").read_text())["scenarios"]
    assert (point["id"], point["outcome"], point["fault_applied"]["file"]) == (
        model["id"], "code_execution", "step-3/model.pkl")


def test_a_payload_the_resume_never_reads_is_skipped_never_passed(tmp_path: Path) -> None:
    cmd = job(tmp_path, "pickle_job.py", PICKLE_JOB, "--fresh")
    proc, doc = run(tmp_path, "--faults", "payload", "--result-file", "final.txt", "--", *cmd)
    points = of_kind(doc, "payload")
    assert points
    for p in points:
        assert (p["verdict"], p["outcome"]) == ("skipped", "no_effect"), p["summary"]
        assert "the payload tested nothing" in p["summary"]


def test_a_json_checkpoint_gets_no_payload_point_and_the_run_says_why(tmp_path: Path) -> None:
    cmd = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]
    proc, doc = run(tmp_path, "--faults", "payload,stale", "--result-file", "final.json", "--", *cmd)
    assert not of_kind(doc, "payload")
    assert any(n.startswith("payload is not explored: no checkpoint file the job left is a pickle")
               for n in doc["job"]["reference"]["notes"])
    assert of_kind(doc, "stale")  # ckpt.json was saved again under its name: stale applies


def test_two_ranks_files_swapped_load_as_each_others(tmp_path: Path) -> None:
    cmd = job(tmp_path, "rank_job.py", RANK_JOB)
    proc, doc = run(tmp_path, "--faults", "swap", "--ranks", "2", "--result-file", "final-r*.txt", "--", *cmd)
    points = of_kind(doc, "swap")
    assert {p["id"].split(":")[0] for p in points} == {"rank0", "rank1"}
    for p in points:
        assert (p["verdict"], p["outcome"]) == ("fail", "silent_divergence"), p["summary"]
        applied = p["fault_applied"]
        rank = int(p["id"][4])
        assert (applied["file"], applied["other"], applied["other_rank"]) == (
            f"ckpt-r{rank}.json", f"ckpt-r{1 - rank}.json", 1 - rank)
    assert "another rank's ckpt-r*.json loads as this rank's" in proc.stdout


def test_a_swap_waits_for_the_other_ranks_file_when_that_rank_lags_this_time(tmp_path: Path) -> None:
    """The plan offers a swap at rank 0's save because rank 1's file of it was complete by then in the
    fault-free run. Ranks that do not wait for each other race: here rank 1 lags in every point's run.
    The launcher lets it run on until its file is there (the halt records the wait), and the swap
    lands; it is never skipped for want of a partner."""
    launches = tmp_path / "launches"
    launches.mkdir()
    cmd = job(tmp_path, "lag_job.py", LAG_JOB, "--launches", str(launches))
    proc, doc = run(tmp_path, "--faults", "swap", "--ranks", "2", "--result-file", "final-r*.txt", "--", *cmd)
    points = [p for p in of_kind(doc, "swap") if p["id"].startswith("rank0:")]
    assert points, [p["id"] for p in of_kind(doc, "swap")]
    for p in points:
        assert p["verdict"] != "skipped", p["summary"]
        assert p["fault_applied"]["other"] == "ckpt-r1.json", p["fault_applied"]
        halted = p["attempts"][0]["halted"]
        assert halted["settled_s"] > 0.1 and "settled" not in halted, halted


def test_a_swap_does_not_wait_for_a_file_the_other_rank_already_removed(tmp_path: Path) -> None:
    """The other rank completed its file and removed it again before this rank's halt: it will not come
    back, so the point is skipped at once, not after the launcher's whole wait."""
    launches = tmp_path / "launches"
    launches.mkdir()
    cmd = job(tmp_path, "gone_job.py", GONE_JOB, "--launches", str(launches))
    proc, doc = run(tmp_path, "--faults", "swap", "--ranks", "2", "--result-file", "final-r*.txt", "--max-points",
                    "2", "--", *cmd)
    points = [p for p in of_kind(doc, "swap") if p["id"].startswith("rank0:")]
    assert points, [p["id"] for p in of_kind(doc, "swap")]
    for p in points:
        assert p["verdict"] == "skipped" and "no other rank's file" in p["summary"], p["summary"]
        halted = p["attempts"][0]["halted"]
        assert halted["settled_s"] < 2.0 and "settled" not in halted, halted


def test_the_careful_example_refuses_another_ranks_file_and_its_fallback_is_no_lost_work(tmp_path: Path) -> None:
    """careful_job.py names its rank under the checksum: a swapped file verifies as a file but is
    not this rank's, so it falls back to its previous checkpoint. The swap damaged both ranks'
    files of that save, so neither rank's acknowledgement of it counts (no false lost work)."""
    cmd = [sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"]
    proc, doc = run(tmp_path, "--faults", "swap", "--ranks", "2", "--result-file", "final-rank*.json", "--", *cmd)
    points = of_kind(doc, "swap")
    assert proc.returncode == 0, [p["summary"] for p in points if p["verdict"] == "fail"]
    assert any(p["verdict"] == "pass" for p in points)
    for p in points:
        excluded = p["oracles"].get("durability", {}).get("evidence", {}).get("not_relied_on")
        if p["verdict"] == "pass" and excluded:
            assert excluded["ranks"] == [0, 1]


@pytest.mark.parametrize(("check", "verdict"), [(False, "fail"), (True, "pass")])
def test_an_older_saves_file_in_a_newer_directory(tmp_path: Path, check: bool, verdict: str) -> None:
    cmd = job(tmp_path, "dir_job.py", DIR_JOB, *(["--check"] if check else []))
    proc, doc = run(tmp_path, "--faults", "stale", "--step-regex", STEP, "--result-file", "final.txt", "--", *cmd)
    points = of_kind(doc, "stale")
    newest = [p for p in points if p["fault_applied"]["file"] == "step-9/state.json"]
    assert newest, [p["id"] for p in points]
    for p in newest:
        assert p["fault_applied"]["source"]["file"] == "step-6/state.json"
        assert p["verdict"] == verdict, p["summary"]
    if not check:
        assert {p["outcome"] for p in newest} == {"silent_divergence"}
        assert "an older copy of step-*/state.json loads as the newest" in proc.stdout


@pytest.mark.parametrize(("weights_only", "outcome"), [
    ("false", "code_execution"),
    pytest.param("true", "hard_failure", marks=pytest.mark.slow),  # the nightly: a torch start-up saved per commit
])
def test_torch_load_runs_the_payload_unless_weights_only(tmp_path: Path, weights_only: str, outcome: str) -> None:
    pytest.importorskip("torch")
    cmd = job(tmp_path, "torch_job.py", TORCH_JOB, "--weights-only", weights_only)
    proc, doc = run(tmp_path, "--faults", "payload", "--step-regex", STEP, "--result-file", "final.pt",
                    "--max-points", "1", "--", *cmd, timeout=600)
    [p] = of_kind(doc, "payload")
    assert p["fault_applied"]["format"] == "torchzip"
    assert p["outcome"] == outcome, p["summary"]  # weights_only=True refuses it: the resume fails, nothing ran
    assert p["oracles"]["no_code_execution"]["result"] == ("fail" if weights_only == "false" else "pass")


# -- the pure parts: which versions, partners and older copies the trace shows


def _op(op: str, path: str, ts: float, rank: int = 0, **kw: Any) -> dict[str, Any]:
    return {"event": "op", "op": op, "path": path, "ts": ts, "rank": rank, "ord": int(ts), **kw}


def test_file_versions_rebuild_each_completed_version_from_the_trace() -> None:
    r = "/o"
    recs = [_op("open", "/o/a.tmp", 1, trunc=True, created=True, mode="wb"),
            _op("write", "/o/a.tmp", 2, offset=0, data=b"v1"),
            _op("close", "/o/a.tmp", 3),
            _op("rename", "/o/a", 4, src="/o/a.tmp", dst="/o/a"),
            _op("open", "/o/a.tmp", 5, trunc=True, created=True, mode="wb"),
            _op("write", "/o/a.tmp", 6, offset=0, data=b"v2!"),
            _op("close", "/o/a.tmp", 7),
            _op("rename", "/o/a", 8, src="/o/a.tmp", dst="/o/a"),
            _op("open", "/o/b", 9, mode="ab"),
            _op("write", "/o/b", 10, offset=0, data=b"x")]
    versions = atrest.file_versions(recs, r)
    assert [v.data for v in versions["a"]] == [b"v1", b"v2!"]
    assert [v.ord for v in stale.older_versions("a", versions, 8)] == [4]
    assert "b" not in versions  # appended to a file from before, never completed
    recs.append(_op("close", "/o/b", 11))
    assert atrest.file_versions(recs, r)["b"][0].data is None  # its bytes before the trace are unknown


def test_swap_partners_are_other_ranks_files_of_one_checkpoint_never_two_saves() -> None:
    files = ["ckpt/rank0.pt", "ckpt/rank1.pt", "ckpt-3.pt", "ckpt-6.pt"]
    completers = {"ckpt/rank0.pt": 0, "ckpt/rank1.pt": 1, "ckpt-3.pt": 0, "ckpt-6.pt": 0}
    assert swap.swap_partners("ckpt/rank1.pt", 1, completers, files) == ["ckpt/rank0.pt"]
    assert swap.swap_partners("ckpt-6.pt", 0, completers, files) == []
