"""``reorder``: a file's pending writes reaching the disk out of order before a power cut (#28).

The family the power model leaves out (it keeps a prefix of each file's pending writes, in
write order), added as one module (chaos/nemesis/reorder.py) and one line of the contract's
table. Real processes and the real CLI on a small job that writes its checkpoint as a body
and a commit footer in two writes, in place:

- never fsynced, trusting the footer: the body lost, the footer kept, the resume reads zeros
  and fails (*hard_failure*), the record naming the write lost and the ones kept;
- never fsynced, verifying a checksum in the footer: it refuses the file and starts over, so
  the work of the save it had trusted is lost (*lost_work*, at the step after the save);
- fsyncing the body before it writes the footer: no write is ever pending behind another, so
  the family offers no point, and the run says why (exit 2: nothing to break).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.model.jobspec import parse_point
from chaos.nemesis import reorder
from chaos.nemesis.family import families, of_mode

REPO = Path(__file__).resolve().parent.parent

FOOTER_JOB = """
import argparse, hashlib, json, os, sys

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--verify", action="store_true")
ap.add_argument("--ordered", action="store_true")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "ckpt.bin")


def load():
    with open(path, "rb") as f:
        data = f.read()
    body, _, footer = data.rpartition(b"\\n#END ")
    if not footer:
        raise ValueError("no footer: an unfinished save")
    if args.verify and hashlib.sha256(body).hexdigest().encode() != footer.strip():
        raise ValueError("checksum mismatch")
    return json.loads(body)


step, w = 0, 1.0
if os.path.exists(path):
    try:
        state = load()
        step, w = state["step"], state["w"]
    except ValueError as exc:
        if not args.verify:
            raise
        print(f"checkpoint refused ({exc}): starting over", file=sys.stderr)
while step < 9:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {w:.6f}", flush=True)
    if step % 3 == 0:
        body = json.dumps({"step": step, "w": w, "pad": "x" * 64}).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, body)
        if args.ordered:
            os.fsync(fd)  # the body is on disk before its commit footer is written
        os.write(fd, b"\\n#END " + hashlib.sha256(body).hexdigest().encode() + b"\\n")
        if args.ordered:
            os.fsync(fd)
        os.close(fd)
with open(os.path.join(args.out, "final.txt"), "w") as f:
    f.write(f"{w:.12f}\\n")
"""


def run(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any] | None]:
    script = tmp / "footer_job.py"
    script.write_text(textwrap.dedent(FOOTER_JOB))
    results = tmp / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp), "--json",
                           str(results), "--faults", "reorder", "--step-regex", r"step (\d+) ", "--result-file",
                           "final.txt", "--", sys.executable, str(script), "--out", "{out}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    return proc, json.loads(results.read_text()) if results.exists() else None


def test_reorder_is_a_family_of_its_own_module_found_by_the_registry() -> None:
    assert families()["reorder"] is reorder.FAMILY and of_mode("reorder") is reorder.FAMILY
    point = parse_point("rank0:op4:reorder:step4")
    assert (point.family, point.to_fault()["kind"], point.at_step) == ("reorder", "reorder", 4)


def test_a_body_lost_behind_its_footer_fails_the_job_that_trusts_the_footer(tmp_path: Path) -> None:
    proc, doc = run(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    points = doc["scenarios"]
    assert points and all(p["faults"][0]["kind"] == "reorder" for p in points)
    assert {p["outcome"] for p in points} == {"hard_failure"}, [p["summary"] for p in points]
    last = next(p for p in points if p["id"] == "rank0:op12:reorder")
    applied = last["fault_applied"]
    assert applied["file"] == "ckpt.bin" and applied["pending_writes"] == 2 and applied["durable_bytes"] == 0
    assert applied["lost"]["offset"] == 0 and [k["offset"] for k in applied["kept_later"]] == [applied["lost"]["length"]]
    assert applied["size_before"] == applied["size_after"]  # zeros where the body was, the footer in place
    assert last["summary"].startswith("ckpt.bin: write 1 of 2 since its last fsync (bytes 0-")
    assert "the data of ckpt.bin is not fsynced" in proc.stdout  # the cause, and its fix


def test_a_job_that_verifies_the_footer_refuses_the_file_and_loses_the_work_it_trusted(tmp_path: Path) -> None:
    proc, doc = run(tmp_path, "--verify")
    trusted = [p for p in doc["scenarios"] if ":step" in p["id"]]
    assert trusted, [p["id"] for p in doc["scenarios"]]
    for p in trusted:
        assert (p["verdict"], p["outcome"]) == ("fail", "lost_work"), p["summary"]
    assert all(p["outcome"] != "hard_failure" for p in doc["scenarios"])


def test_a_job_that_fsyncs_the_body_before_its_footer_offers_no_reorder_point(tmp_path: Path) -> None:
    proc, doc = run(tmp_path, "--ordered")
    assert proc.returncode == 2 and doc is None
    assert "no point to break with --faults reorder" in proc.stderr
    assert "reorder is not explored: no checkpoint file had two or more writes pending" in proc.stderr


TORCH_JOB = """
import argparse, os, torch
ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "ckpt.pt")
step, w = 0, torch.ones(2000)
if os.path.exists(path):
    state = torch.load(path, weights_only=True)
    step, w = state["step"], state["w"]
while step < 6:
    step += 1
    w = w * 0.9 + step
    print(f"step {step} loss {float(w.sum()):.6f}", flush=True)
    if step % 3 == 0:
        torch.save({"step": step, "w": w}, path)  # no fsync
torch.save({"w": w}, os.path.join(args.out, "final.pt"))
"""


@pytest.mark.slow
def test_torch_save_without_fsync_loads_zeros_when_its_data_write_is_lost(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "torch_job.py"
    script.write_text(textwrap.dedent(TORCH_JOB))
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--json",
                           str(results), "--faults", "reorder", "--result-file", "final.pt", "--point",
                           "rank0:op10:reorder", "--", sys.executable, str(script), "--out", "{out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    [p] = json.loads(results.read_text())["scenarios"]
    assert (p["verdict"], p["outcome"]) == ("fail", "silent_divergence"), proc.stdout + proc.stderr
    assert p["fault_applied"]["pending_writes"] >= 2 and "final.pt" in p["summary"]


def _w(ts: float, off: int, data: bytes, path: str = "/o/f") -> dict[str, Any]:
    return {"event": "op", "op": "write", "path": path, "offset": off, "length": len(data), "data": data, "ts": ts,
            "ord": int(ts)}


@pytest.mark.parametrize(("writes", "effective"), [
    ([(0, b"aaaa"), (4, b"bb")], [0]),          # appended: losing the first leaves a hole
    ([(0, b"aaaa"), (0, b"bbbb")], []),         # overwritten whole: losing the first changes nothing
    ([(0, b"aaaa"), (2, b"bb"), (6, b"c")], [0, 1]),
])
def test_which_pending_writes_matter_when_lost(writes: list[tuple[int, bytes]], effective: list[int]) -> None:
    recs = [{"event": "op", "op": "open", "path": "/o/f", "trunc": True, "created": True, "mode": "wb", "ts": 0.5}]
    recs += [_w(i + 1.0, off, data) for i, (off, data) in enumerate(writes)]
    f = reorder.pending_writes(recs)["/o/f"]
    assert f.durable == b"" and len(f.pending) == len(writes)
    assert reorder._effective(f) == effective


def test_an_fsync_makes_the_writes_before_it_durable_and_a_rename_carries_the_file() -> None:
    recs = [{"event": "op", "op": "open", "path": "/o/t", "trunc": True, "created": True, "mode": "wb", "ts": 0.5},
            _w(1.0, 0, b"body", "/o/t"),
            {"event": "op", "op": "fsync", "path": "/o/t", "ts": 2.0},
            _w(3.0, 4, b"!", "/o/t"),
            {"event": "op", "op": "rename", "path": "/o/f", "src": "/o/t", "dst": "/o/f", "ts": 4.0}]
    f = reorder.pending_writes(recs)["/o/f"]
    assert f.durable == b"body" and [w["offset"] for w in f.pending] == [4]
    assert reorder.pending_writes(recs, upto=2.5)["/o/t"].pending == []


_OPS = st.sampled_from(["open", "write", "fsync", "rename", "unlink"])


@given(st.lists(st.tuples(_OPS, st.sampled_from(["/o/a", "/o/b", "/o/d/c"]), st.integers(0, 8),
                          st.binary(min_size=1, max_size=4)), max_size=40),
       st.lists(st.floats(0, 45), max_size=6))
def test_replaying_once_forward_gives_each_moment_what_a_replay_from_the_start_gives(
        ops: list[tuple[str, str, int, bytes]], moments: list[float]) -> None:
    """reorder.points asks at every checkpoint site in time order from one forward replay
    (_Replay.advance); each answer must be what pending_writes from scratch gives then."""
    recs: list[dict[str, Any]] = []
    for i, (op, path, off, data) in enumerate(ops):
        rec: dict[str, Any] = {"event": "op", "op": op, "path": path, "ts": float(i)}
        if op == "open":
            rec.update(trunc=off % 2 == 0, created=off % 3 == 0, mode="wb")
        elif op == "write":
            rec.update(offset=off, length=len(data), data=data)
        elif op == "rename":
            rec.update(src=path, dst="/o/r" + path[2:])
        recs.append(rec)
    replay = reorder._Replay(recs)
    for t in sorted(moments):
        assert replay.advance(t) == reorder.pending_writes(recs, t)
    assert replay.advance() == reorder.pending_writes(recs)
