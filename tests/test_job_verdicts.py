"""Verdicts of ``chaos run -- COMMAND`` that must hold without the probe (issue #34, items 1, 10-13, 15).

Each test runs a small job of its own shape through the real CLI (real processes, real
files, pure Python but one) and asserts what the results document says:

- a plain script that saves in place and never fsyncs loses the checkpoint it trained
  past in a power cut: *lost_work*, inferred from its trace alone (no ``chaos.probe``),
  judged on what it relied on before the cut, with and without ``--checkpoint-glob``; the
  same script saving carefully passes every power point; where no step can be known the
  line says "lost work not judged" and why (item 1, item 12);
- a file written by a native writer the tracer does not see (libc through ctypes) is named,
  with its sizes, in the record of every point; a power loss keeps it as it was at the cut
  and says so, instead of deleting it silently (items 10, 11);
- a full disk that only an untraced writer hit is judged, never "did nothing" (item 13);
- ``--step-regex`` is not overruled by ``--loss-regex``; a power point beyond its cut's
  distinct states says why without contradicting itself (item 15).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from faults.disk import can_mount_tmpfs

REPO = Path(__file__).resolve().parent.parent
LOSS = r"step (?P<step>\d+) loss (?P<loss>\S+)"
TMPFS, TMPFS_WHY = can_mount_tmpfs()

# A plain training script: no probe; prints "step N loss X"; saves {"step", "w"} every --every steps,
# in place (one ckpt.pkl, or ckpt-<step>.pkl with --named), never fsyncing; --careful saves the safe
# way: temp file, fsync, rename, directory fsync. --torch: torch.save / torch.load (the path form).
PLAIN = """
    import argparse, glob, os, pickle, re
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--careful", action="store_true")
    ap.add_argument("--named", action="store_true")
    ap.add_argument("--torch", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ext = ".pt" if a.torch else ".pkl"
    if a.torch:
        import torch

    def write(obj, path):
        if a.torch and not a.careful:
            torch.save(obj, path)
            return
        with open(path, "wb") as f:
            torch.save(obj, f) if a.torch else pickle.dump(obj, f)
            if a.careful:
                f.flush()
                os.fsync(f.fileno())

    def save(obj, path):
        if not a.careful:
            return write(obj, path)
        write(obj, path + ".tmp")
        os.replace(path + ".tmp", path)
        fd = os.open(a.out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def load(path):
        if a.torch:
            return torch.load(path)
        with open(path, "rb") as f:
            return pickle.load(f)

    if a.named:
        found = sorted((int(re.search(r"(\\d+)", os.path.basename(p)).group(1)), p)
                       for p in glob.glob(os.path.join(a.out, "ckpt-*" + ext)))
    else:
        found = [(0, p) for p in [os.path.join(a.out, "ckpt" + ext)] if os.path.exists(p)]
    step, w = 0, [0.0, 0.0, 0.0, 0.0]
    if found:
        state = load(found[-1][1])
        step, w = state["step"], state["w"]
        print(f"resumed from step {step}", flush=True)
    while step < a.steps:
        step += 1
        w = [x - 0.1 * (x - (i + 1) * 0.5) + 0.001 * step for i, x in enumerate(w)]
        print(f"step {step} loss {sum((x - (i + 1) * 0.5) ** 2 for i, x in enumerate(w)):.6f}", flush=True)
        if step % a.every == 0:
            save({"step": step, "w": w}, os.path.join(a.out, (f"ckpt-{step}" if a.named else "ckpt") + ext))
    save({"step": step, "w": w}, os.path.join(a.out, "final" + ext))
"""
# Events of PLAIN (careless, 7 steps): 0 the mkdir of {out} (EEXIST), 1-3 open/write/close of the
# step-5 checkpoint, 4-6 open/write/close of final.pkl, after steps 6 and 7 were announced.
AT_FINAL = "rank0:op4:power"

# Weights written by a native writer (libc through ctypes), metadata by Python's open: the shape of
# an HDF5 checkpoint written through h5py beside a JSON file. The native tracer sees such writes
# (tests/test_native_tracer.py); these tests run with --no-native-trace, as for a writer nothing
# sees (raw syscalls, a static binary), to check what the harness says about untraced files.
NATIVE = """
    import argparse, ctypes, json, os
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--blob", type=int, default=16384)
    a = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    meta, weights = os.path.join(a.out, "meta.json"), os.path.join(a.out, "weights.bin")

    def c_write(path, data):
        fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        done = 0
        while fd >= 0 and done < len(data):
            n = libc.write(fd, data[done:], len(data) - done)
            if n < 0:
                e = ctypes.get_errno()
                libc.close(fd)
                raise OSError(e, "Can't write file", path)
            done += n
        if fd < 0 or libc.close(fd) != 0:
            raise OSError(ctypes.get_errno(), "Can't close file", path)

    step = 0
    if os.path.exists(meta):
        with open(meta) as f:
            step = json.load(f)["step"]
        with open(weights, "rb") as f:
            if f.read() != bytes([step]) * a.blob:
                raise RuntimeError(f"weights.bin does not hold step {step}")
        print(f"resumed from step {step}", flush=True)
    while step < 6:
        step += 1
        print(f"step {step} loss {1.0 / step:.6f}", flush=True)
        if step % 2 == 0:
            with open(meta, "w") as f:
                json.dump({"step": step}, f)
            c_write(weights, bytes([step]) * a.blob)
"""
# Events of NATIVE: open/write/close of meta.json at steps 2 (0-2), 4 (3-5) and 6 (6-8); weights.bin: none.


def script(tmp: Path, name: str, body: str) -> list[str]:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path), "--out", "{out}"]


def run(tmp: Path, *args: str, name: str = "r.json") -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    results = tmp / name
    scratch = tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), "--json", str(results),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc, json.loads(results.read_text())


def by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in doc["scenarios"]}


def durability(s: dict[str, Any]) -> dict[str, Any]:
    return s["oracles"]["durability"]


# ---------------------------------------------------------------------- item 1: lost work without the probe
def test_a_plain_script_that_trained_past_its_checkpoint_loses_it_in_a_power_cut(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--loss-regex", LOSS, "--point", AT_FINAL, "--", *plain)
    assert proc.returncode == 1, proc.stdout
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "lost_work", s["summary"]
    assert "ckpt.pkl: 69 unsynced byte(s) lost; then rank 0 resumed from scratch, but its checkpoint of step 5" \
        in s["summary"]
    [relied] = durability(s)["evidence"]["relied_on"]
    assert (relied["name"], relied["step"]) == ("ckpt.pkl", 5)
    assert relied["since"] == "finished at rank 0's event 3, then step 6 announced after it"
    assert relied["step_from"] == "the last step announced before it was written"
    assert durability(s)["evidence"]["ranks"]["0"]["resumed_at"] == 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_save_in_place_every_5_steps_loses_the_checkpoint_it_trained_past(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    proc, doc = run(tmp_path, "--result-file", "final.pt", "--loss-regex", LOSS, "--point", AT_FINAL, "--", *plain,
                    "--torch")
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "lost_work", s["summary"]
    assert "rank 0 resumed from scratch, but its checkpoint of step 5 was complete (ckpt.pt relied on before the " \
           "power loss" in s["summary"]


def test_the_same_script_saved_carefully_passes_every_power_point(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--loss-regex", LOSS, "--faults", "power", "--", *plain,
                    "--careful")
    assert proc.returncode == 0, proc.stdout
    judged = [s for s in doc["scenarios"] if s["verdict"] != "skipped"]
    assert len(judged) >= 15 and {s["outcome"] for s in judged} == {"pass"}
    # judged, not waved through: where the job had trained past its checkpoint it resumed from it
    relied = [durability(s)["evidence"] for s in judged if durability(s)["evidence"].get("relied_on")]
    assert len(relied) >= 5
    assert {(e["ranks"]["0"]["newest_complete"], e["ranks"]["0"]["resumed_at"]) for e in relied} == {(5, 5)}


def test_where_no_step_can_be_known_the_line_says_lost_work_was_not_judged(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--point", AT_FINAL, "--", *plain)  # no --loss-regex
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "pass"
    assert durability(s)["result"] == "not_judged"
    assert s["summary"].endswith("; lost work not judged: the job relied on ckpt.pkl (finished at rank 0's event 3, "
                                 "then a later file event (open of final.pkl, event 4)), but the step it holds is "
                                 "unknown: no step was announced before it was written (give --step-regex or "
                                 "--loss-regex, or call chaos.probe.step / chaos.probe.saved)")
    assert any(n.startswith("lost work is not judged: no step is known") for n in doc["job"]["reference"]["notes"])


# ---------------------------------------------------------------------- item 12: judged before the cut
def test_a_power_cut_that_erased_every_checkpoint_matching_the_glob_is_lost_work(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    # steps in the names: ckpt-5.pkl, erased by the cut; the crashed tree holds no match at all
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--checkpoint-glob", "ckpt-*.pkl", "--loss-regex", LOSS,
                    "--point", AT_FINAL, "--", *plain, "--named")
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "lost_work", s["summary"]
    assert "ckpt-5.pkl relied on before the power loss" in s["summary"] and "step 5: the number in its name" \
        in s["summary"]
    assert durability(s)["evidence"]["complete_checkpoints_after_kill"] == []  # what the cut left: nothing
    # no step in the name: the trace says which step it holds
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--checkpoint-glob", "ckpt.pkl", "--loss-regex", LOSS,
                    "--point", AT_FINAL, "--", *plain, name="unnamed.json")
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "lost_work", s["summary"]
    assert "step 5: the last step announced before it was written" in s["summary"]
    # no step in the name and none announced: not judged, and said so, never "nothing to lose"
    proc, doc = run(tmp_path, "--result-file", "final.pkl", "--checkpoint-glob", "ckpt.pkl", "--point", AT_FINAL,
                    "--", *plain, name="unknown.json")
    s = by_id(doc)[AT_FINAL]
    assert s["outcome"] == "pass" and "nothing to lose" not in s["summary"]
    assert durability(s)["summary"].startswith("lost work not judged: the job relied on ckpt.pkl (")
    assert "its name carries no number and no step was announced before it was written" in durability(s)["summary"]


# ---------------------------------------------------------------------- items 10, 11: untraced writers
def test_a_file_no_traced_event_explains_is_named_with_its_sizes(tmp_path: Path) -> None:
    native = script(tmp_path, "native.py", NATIVE)
    # killed right after the step-4 metadata was written, before its weights: the resume raises
    proc, doc = run(tmp_path, "--loss-regex", LOSS, "--point", "rank0:op4:after", "--no-native-trace", "--", *native)
    s = by_id(doc)["rank0:op4:after"]
    weights = {"file": "weights.bin", "size_before": None, "size_after": 16384, "how": "written by no traced event"}
    assert s["untraced_changes"] == [weights]
    assert s["outcome"] == "hard_failure"
    assert s["summary"].endswith("RuntimeError: weights.bin does not hold step 4 (1 file(s) under {out} changed that "
                                 "no traced event explains: weights.bin (absent -> 16384 bytes, written by no "
                                 "traced event))")
    assert doc["job"]["reference"]["untraced_changes"] == [weights]
    assert doc["job"]["reference"]["untraced_files"] == ["weights.bin"]


def test_a_power_loss_keeps_an_untraced_file_as_it_was_and_names_it(tmp_path: Path) -> None:
    native = script(tmp_path, "native.py", NATIVE)
    proc, doc = run(tmp_path, "--loss-regex", LOSS, "--point", "rank0:op5:power", "--no-native-trace", "--", *native)
    s = by_id(doc)["rank0:op5:power"]
    applied = s["fault_applied"]
    assert applied["files_before"] == ["meta.json", "weights.bin"] and applied["files_after"] == ["weights.bin"]
    assert applied["untraced"] == [{"file": "weights.bin", "size_before": None, "size_after": 16384,
                                    "how": "written by no traced event",
                                    "kept": "kept as it was at the cut (its durability unknown)"}]
    assert s["summary"].startswith("power loss right after rank 0's event 5: create of meta.json lost (directory "
                                   "not fsynced); meta.json: 22 unsynced byte(s) lost; weights.bin (absent -> "
                                   "16384 bytes, written by no traced event): kept as it was at the cut")
    assert s["outcome"] == "pass"  # the metadata is gone, so the job started over: nothing it relied on is known
    assert durability(s)["summary"].startswith("lost work not judged: 1 file(s) under {out} changed that no traced "
                                               "event explains (weights.bin)")


# ---------------------------------------------------------------------- item 13: a full disk only C hit
@pytest.mark.skipif(not TMPFS, reason=TMPFS_WHY)
def test_a_full_disk_that_only_an_untraced_writer_hit_is_judged(tmp_path: Path) -> None:
    native = script(tmp_path, "native.py", NATIVE)
    # two pages: meta.json takes one, weights.bin gets one of its four and fails with ENOSPC in C
    proc, doc = run(tmp_path, "--loss-regex", LOSS, "--point", "disk:full:8192", "--point", "disk:full:1048576",
                    "--no-native-trace", "--", *native)
    assert proc.returncode == 1, proc.stdout
    full, roomy = by_id(doc)["disk:full:8192"], by_id(doc)["disk:full:1048576"]
    assert full["outcome"] == "hard_failure", full["summary"]
    assert full["summary"].startswith("{out} on a 8192-byte tmpfs: no traced event got ENOSPC, but attempt 0 exited "
                                      "1 (OSError: [Errno 28] Can't write file: ")
    assert "1 file(s) under {out} changed that no traced event explains: weights.bin (absent -> 4096 bytes" \
        in full["summary"]
    assert "RuntimeError: weights.bin does not hold step 2" in full["summary"]
    assert "meta.json" not in full["summary"].split("; then ")[0]  # no traced file blamed in its place
    # a disk with room for everything: nothing hit, every oracle passed, the point did nothing
    assert (roomy["verdict"], roomy["outcome"]) == ("skipped", "no_effect")
    assert roomy["summary"].startswith("the job never hit ENOSPC on a 1048576-byte tmpfs {out}")


# ---------------------------------------------------------------------- item 15
LOCAL = """
    import argparse, json, os
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ckpt = os.path.join(a.out, "state.json")
    step = 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            step = json.load(f)["step"]
        print(f"resumed from step {step}", flush=True)
    i = 0
    while step < 8:
        step += 1
        i += 1
        print(f"iter {i} loss {1.0 / step:.6f}", flush=True)  # this process's iterations, not the global step
        if step % 3 == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(ckpt + ".tmp", ckpt)
            fd = os.open(a.out, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
"""


def test_the_step_regex_is_not_overruled_by_the_loss_regex(tmp_path: Path) -> None:
    local = script(tmp_path, "local.py", LOCAL)
    # killed at step 8, past the durable step-6 save; the restart's loss lines start again at "iter 1",
    # its resume line says 6
    proc, doc = run(tmp_path, "--step-regex", r"resumed from step (\d+)", "--loss-regex", r"iter (\d+) loss (\S+)",
                    "--point", "rank0:step8:kill", "--", *local)
    d = durability(by_id(doc)["rank0:step8:kill"])
    rank = d["evidence"]["ranks"]["0"]
    assert (rank["resumed_at"], rank["resumed_by"]) == (6, "first --step-regex match after the restart")
    assert rank["resume_sources"] == {"first chaos.probe.step or --loss-regex line, minus one": 0,
                                      "first --step-regex match after the restart": 6}
    assert d["result"] == "pass" and rank["newest_complete"] == 6


def test_a_power_point_beyond_its_cuts_distinct_states_says_why_without_contradiction(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.py", PLAIN)
    proc, doc = run(tmp_path, "--loss-regex", LOSS, "--point", "rank0:op2:power:s3", "--", *plain)
    s = by_id(doc)["rank0:op2:power:s3"]
    assert (s["verdict"], s["outcome"]) == ("skipped", "no_effect")
    assert s["summary"] == ("the cut's 6 combinations of pending changes leave only 2 distinct crash state(s) "
                            "besides everything lost and nothing lost (the others leave the same files: a change "
                            "kept or lost there makes no difference to what is on disk); this point asks for state 3")
