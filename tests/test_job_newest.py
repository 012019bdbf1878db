"""The built-in ``ckpt:stepS:KIND`` (``KIND:step=S,...``) as a user's job's point: a file of the newest
checkpoint struck at rest, so ``chaos run --as-job --fault bitflip:step=8,bits=16,region=data``
(the default campaign's) runs through the job pipeline (issue #28).

Every copy halts when rank 0 announces step S; the newest checkpoint's files are read from the
halted attempt's traces (``chaos.nemesis.newest``), one is drawn with the fault's seed and struck
with the fault's own settings. Unit tests for the grammar, the files and the draw; then real
one-process jobs through the CLI, and the built-in workload through ``--as-job`` (slow).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from jobcli import CAREFUL, CARELESS, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_fault, parse_point
from chaos.nemesis.newest import choose, newest_files


def test_a_fault_of_the_newest_checkpoint_reads_in_both_spellings() -> None:
    point = parse_point("bitflip:step=8,bits=16,region=data,seed=1")
    assert point == parse_point("ckpt:step8:bitflip,bits=16,region=data,seed=1")
    assert (point.family, point.mode, point.at_step, point.op, point.id) == (
        "corrupt", "bitflip", 8, None, "ckpt:step8:bitflip,bits=16,region=data,seed=1")
    assert parse_point(point.id) == point and point.env()["at_step"] == 8
    entry, builtin = point.to_fault(), parse_fault(point.id).to_dict()
    assert (entry["kind"], entry["step"], entry["spec"]) == (builtin["kind"], builtin["step"], builtin["spec"])
    assert builtin["params"].items() <= entry["params"].items()
    assert {parse_point(f"ckpt:step4:{k}").family for k in ("stale", "swap", "payload")} == {"stale", "swap", "payload"}
    assert parse_point("rank0:op9:bitflip:step6").builtin is None  # the job's own point stays one
    with pytest.raises(ConfigError, match="takes no second fault"):
        parse_point("ckpt:step8:delete+rank0:op1:before")
    with pytest.raises(ConfigError, match="attempt= is the built-in workload's"):
        parse_point("delete:step=8,attempt=1")


def _phase(name: str, **info: object) -> dict:
    return {"event": "phase", "name": name, "info": info}


def _op(n: int, op: str, rel: str) -> dict:
    return {"event": "op", "op": op, "ord": n, "rel": rel, "ts": float(n)}


def test_the_newest_checkpoint_s_files_are_those_its_save_completed(tmp_path: Path) -> None:
    for rel in ("ckpt/step-3/a.bin", "ckpt/step-6/a.bin", "ckpt/step-6/b.bin", "ckpt/latest", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * 8)
    traces = {(0, 0): [
        _op(0, "close", "notes.txt"),  # before any step: no save's
        _phase("save", step=3), _op(1, "close", "ckpt/tmp3/a.bin"), _op(2, "rename", "ckpt/step-3"),
        _op(3, "rename", "ckpt/latest"),
        _phase("save", step=6), _op(4, "close", "ckpt/tmp6/a.bin"), _op(5, "close", "ckpt/tmp6/b.bin"),
        _op(6, "rename", "ckpt/step-6"), _op(7, "rename", "ckpt/latest"),
        _op(8, "close", "ckpt"),  # the root's fsync'd directory handle closed: completes none of its files
        _phase("save", step=9), _op(9, "close", "ckpt/tmp9/a.bin"),  # (gone by the halt)
    ]}
    assert newest_files(str(tmp_path), traces, 8) == (6, ["ckpt/latest", "ckpt/step-6/a.bin", "ckpt/step-6/b.bin"])
    assert newest_files(str(tmp_path), traces, 5) == (3, ["ckpt/step-3/a.bin"])
    assert newest_files(str(tmp_path), traces, 2) == (None, [])
    files = ["ckpt/latest", "ckpt/step-6/a.bin", "ckpt/step-6/b.bin"]
    picked, record = choose(parse_fault("ckpt:step8:delete,seed=4"), str(tmp_path), files)
    assert picked in files and choose(parse_fault("ckpt:step8:delete,seed=4"), str(tmp_path), files)[0] == picked
    assert record["random_key"] == "4:delete" and record["of"] == 3
    assert choose(parse_fault("ckpt:step8:delete,file=b.bin"), str(tmp_path), files)[0] == "ckpt/step-6/b.bin"
    assert choose(parse_fault("ckpt:step8:delete,file=*.pt"), str(tmp_path), files)[0] is None


def _scenarios(tmp_path: Path, job: Path, *points: str) -> dict[str, dict]:
    proc, doc = run_json(tmp_path, *(a for p in points for a in ("--point", p)), "--result-file", "final.json", "--",
                         sys.executable, str(job), "--out", "{out}")
    return {s["id"]: s for s in doc["scenarios"]}


POINTS = ("ckpt:step8:bitflip,seed=1", "truncate:step=8,seed=2", "ckpt:step8:delete", "ckpt:step8:zero,length=4")


def test_the_newest_checkpoint_struck_finds_what_the_careless_job_lacks(tmp_path: Path) -> None:
    got = _scenarios(tmp_path, CARELESS, *POINTS, "ckpt:step8:payload")
    flip = got["ckpt:step8:bitflip,seed=1"]
    assert flip["outcome"] == "silent_divergence", flip["summary"]  # no checksum: the flipped bit is trained on
    assert flip["summary"].startswith("the checkpoint of step 6, newest when rank 0 announced step 8: ckpt.json: "
                                      "bit ")
    assert got["ckpt:step8:truncate,seed=2"]["outcome"] == "hard_failure"
    assert got["ckpt:step8:delete"]["outcome"] == "lost_work"  # one file, written in place: nothing to fall back on
    payload = got["ckpt:step8:payload"]
    assert (payload["verdict"], payload["outcome"]) == ("skipped", "unsupported")  # JSON: nothing unpickles it


def test_the_careful_job_falls_back_when_its_newest_checkpoint_is_struck(tmp_path: Path) -> None:
    got = _scenarios(tmp_path, CAREFUL, *POINTS)
    for result in got.values():
        assert (result["verdict"], result["outcome"]) == ("pass", "pass"), result["summary"]
        assert "the checkpoint of step 6, newest when rank 0 announced step 8: ckpt-000006.json" in result["summary"]


@pytest.mark.slow
def test_the_built_in_workload_s_at_rest_faults_run_as_a_job(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--as-job", "--steps", "12", "--save-every", "3", "--fault",
                         "bitflip:step=8,bits=16,region=data,seed=0", "--fault",
                         "ckpt:step8:zero,seed=1,file=shard-r00001.safetensors")
    got = {s["id"]: s for s in doc["scenarios"]}
    assert set(got) == {"ckpt:step8:bitflip,bits=16,region=data,seed=0",
                        "ckpt:step8:zero,file=shard-r00001.safetensors,seed=1"}, proc.stdout[-2000:]
    for result in got.values():  # the reference checks its checkpoint and falls back to step 3's, on every rank
        assert (result["verdict"], result["outcome"]) == ("pass", "pass"), result["summary"]
        assert result["summary"].startswith("the checkpoint of step 6, newest when rank 0 announced step 8: ckpt/")
        assert "rank 0 at step 3 (newest complete: 3), rank 1 at step 3 (newest complete: 3)" in result["summary"]
    assert "16 bits flipped" in got["ckpt:step8:bitflip,bits=16,region=data,seed=0"]["summary"]
