"""How an at-rest fault's target is chosen from a traced fault-free load (``chaos.plan.loadtrace``).

Issue #34, item 16: the target used to be drawn at random from the newest checkpoint's
files, so a pickled manifest beside many checksummed shards rarely got the payload. On
fabricated trees and load traces (no ranks; ``tests/test_payload_targets.py`` runs the
real thing) these tests pin the rules:

- kinds: a file's path with its numbers made ``*`` (``step-*/rank*.pt``), a glob ``file=``
  takes as it is;
- reads: each rank's files in the order first opened to read (the audit hook's lines and
  the interposer's ``os.open`` records merged by time), writes and directories left out;
- no ``file=``: the first kind the load read that the fault can act on (for a payload, the
  first in its format), one of its files drawn with the seed; ``file=GLOB``: seeded among
  the matching files the load read; no trace: exactly the old seeded choice, and why;
- every record reproduces its target: ``Random(choice["rng"]).choice(choice["among"])``;
- a campaign's read sweep puts a payload and a corruption in every kind the load reads,
  and its drawn at-rest faults aim at those kinds.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest

from chaos.nemesis.environment import Environment
from chaos.plan.loadtrace import LoadTrace, choose, kind_of, matches, merge, reads_of
from chaos.plan.scenario import Scenario, parse_fault
from chaos.record.history import RunRecord
from chaos.record.points import TracePoints
from chaos.run.campaign import ReadCoverage, fill_budget, read_sweep
from chaos.run.runner import ScenarioResult
from chaos.target.workload.config import WorkloadConfig
from faults.payload import speaks

MANIFEST_KIND = "step-*/manifest.pkl"


def _zip(step: int, rank: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"step": step, "rank": rank}, protocol=2))
    return buf.getvalue()


def _tree(root: Path) -> dict[str, Path]:
    """The pickled-manifest layout: ``latest``, ``step-*/manifest.pkl`` and two rank shards (torch zips)."""
    files = {}
    for step in (4, 8):
        d = root / f"step-{step:08d}"
        d.mkdir(parents=True)
        files[f"manifest{step}"] = d / "manifest.pkl"
        files[f"manifest{step}"].write_bytes(pickle.dumps(
            {"step": step, "shards": {r: {"bytes": 1000, "sha256": "ab" * 32} for r in (0, 1)}}, protocol=4))
        for r in (0, 1):
            files[f"rank{r}.{step}"] = d / f"rank{r}.pt"
            files[f"rank{r}.{step}"].write_bytes(_zip(step, r))
    files["latest"] = root / "latest"
    files["latest"].write_text("step-00000008")
    files["notes"] = root / "step-00000008" / "notes.txt"  # a file no load reads
    files["notes"].write_text("x" * 200)
    return files


def _trace() -> LoadTrace:
    """What the pickled-manifest checkpointer's load reads: ``latest``, the manifest, its own shard."""
    return LoadTrace({0: ["latest", "step-00000008/manifest.pkl", "step-00000008/rank0.pt"],
                      1: ["latest", "step-00000008/manifest.pkl", "step-00000008/rank1.pt"]})


def _newest(files: dict[str, Path]) -> list[str]:
    return sorted(str(p) for k, p in files.items() if k.endswith(".8") or k in ("latest", "notes", "manifest8"))


def test_kind_of_makes_numbers_and_nonces_globs_that_match_the_kind() -> None:
    assert kind_of("step-00000020/rank1.pt") == "step-*/rank*.pt"
    assert kind_of("latest") == "latest"
    assert kind_of("step_00000008/__1_0.distcp") == "step_*/__*_*.distcp"
    assert kind_of("step-0000000008/shard-r00001.safetensors") == "step-*/shard-r*.safetensors"
    assert kind_of("data/step-0000000016-3fa9c1/manifest.json") == "data/step-*-*/manifest.json"
    assert kind_of("odd[1],name?.bin") == "odd[[]*[]]?name[?].bin"
    assert matches("step-00000004/rank0.pt", "step-*/rank*.pt") and not matches("latest.tmp", "latest")
    assert matches("odd[7],name?.bin", kind_of("odd[1],name?.bin"))
    assert parse_fault(f"payload:step=3,file={kind_of('odd[1],name?.bin')}").param("file") == "odd[[]*[]]?name[?].bin"


def test_reads_of_keeps_first_reads_in_order_and_leaves_out_writes_and_directories(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    root = str(tmp_path)
    audit = [  # LoadTracer's lines: builtins.open (mode) and os.open (mode None, int flags)
        {"path": str(files["latest"]), "mode": "r", "flags": os.O_RDONLY, "ts": 1.0},
        {"path": str(tmp_path / "latest.tmp"), "mode": "w", "flags": os.O_WRONLY | os.O_CREAT, "ts": 1.5},
        {"path": str(files["rank0.8"]), "mode": "rb", "flags": os.O_RDONLY, "ts": 4.0},
        {"path": str(files["latest"]), "mode": "rb", "flags": os.O_RDONLY, "ts": 5.0},
        {"path": "/elsewhere/x", "mode": "rb", "flags": 0, "ts": 0.5},
    ]
    interposed = [  # the interposer's os.open records (a dir_fd walk resolved), and a directory
        {"event": "op", "op": "open", "path": str(tmp_path / "step-00000008"), "flags": ["O_RDONLY"], "is_dir": True,
         "ts": 2.0},
        {"event": "op", "op": "open", "path": str(files["manifest8"]), "flags": ["O_RDONLY", "O_NOFOLLOW"],
         "is_dir": False, "ts": 3.0},
        {"event": "op", "op": "open", "path": str(files["notes"]), "flags": ["O_WRONLY", "O_CREAT"], "ts": 3.5},
        {"event": "op", "op": "open", "path": str(files["rank1.8"]), "flags": ["O_RDONLY"], "error": 2, "ts": 3.6},
    ]
    assert reads_of(audit, interposed, root) == ["latest", "step-00000008/manifest.pkl", "step-00000008/rank0.pt"]
    assert merge({1: ["a", "c"], 0: ["a", "b", "d"]}) == ["a", "b", "c", "d"]
    assert _trace().kinds == ["latest", MANIFEST_KIND, "step-*/rank*.pt"]


def test_speaks_tells_which_files_a_payload_format_belongs_in(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    assert speaks(files["manifest8"], "pickle") and speaks(files["rank0.8"], "pickle")
    assert speaks(files["rank0.8"], "torchzip") and not speaks(files["latest"], "pickle")
    assert not speaks(files["manifest8"], "safetensors-header")
    st = tmp_path / "x.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    st.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    assert speaks(st, "safetensors-header") and not speaks(st, "pickle")


def test_a_payload_goes_to_the_first_file_read_in_its_format_and_the_record_reproduces_it(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    for seed in range(20):
        target, choice = choose(parse_fault(f"payload:step=9,format=pickle,seed={seed}"), str(tmp_path),
                                _newest(files), _trace())
        assert target == str(files["manifest8"]), (seed, choice)
        assert choice["by"] == "first read" and choice["kind"] == MANIFEST_KIND
        assert choice["kinds"] == ["latest", MANIFEST_KIND, "step-*/rank*.pt"]
        assert choice["format_fits"] == [MANIFEST_KIND, "step-*/rank*.pt"]
        # The target follows from the seed and the record alone.
        assert random.Random(choice["rng"]).choice(choice["among"]) == os.path.relpath(target, tmp_path)
        assert choice["rng"] == f"{seed}:payload:target"
    # A format no file read speaks: the first file read all the same.
    target, choice = choose(parse_fault("payload:step=9,format=safetensors-header"), str(tmp_path), _newest(files),
                            _trace())
    assert target == str(files["latest"]) and choice["format_fits"] == []


def test_a_corruption_goes_to_the_first_file_read_that_it_can_change(tmp_path: Path) -> None:
    from faults.corrupt import corruptible

    files = _tree(tmp_path)
    target, choice = choose(parse_fault("truncate:step=9,seed=3"), str(tmp_path), _newest(files), _trace())
    assert target == str(files["latest"]) and choice["by"] == "first read"
    able = corruptible(_newest(files), "bitflip", region="data")  # as the environment filters first
    target, choice = choose(parse_fault("bitflip:step=9,region=data,seed=3"), str(tmp_path), able, _trace())
    assert target == str(files["manifest8"]) and choice["kind"] == MANIFEST_KIND
    # file=KIND: one of that kind's files, drawn with the seed; both ranks' shards come up.
    got = {choose(parse_fault(f"delete:step=9,seed={s},file=step-*/rank*.pt"), str(tmp_path), _newest(files),
                  _trace())[0] for s in range(12)}
    assert got == {str(files["rank0.8"]), str(files["rank1.8"])}


def test_file_glob_draws_with_the_seed_among_the_files_the_load_read(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    seen = set()
    for seed in range(40):
        target, choice = choose(parse_fault(f"bitflip:step=9,seed={seed},file=*"), str(tmp_path), _newest(files),
                                _trace())
        assert choice["by"] == "seeded among read" and "step-00000008/notes.txt" not in choice["among"]
        assert random.Random(choice["rng"]).choice(choice["among"]) == os.path.relpath(target, tmp_path)
        seen.add(target)
    assert str(files["notes"]) not in seen and len(seen) == 4  # latest, the manifest, both shards


def test_without_a_traced_load_the_choice_is_the_old_seeded_one_and_says_why(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    newest = _newest(files)
    for seed in range(10):
        fault = parse_fault(f"payload:step=9,seed={seed}")
        old = random.Random(f"{seed}:payload:target").choice(newest)  # what the environment did before
        for trace, why in ((None, "the launch plan was not handed over"),
                           (LoadTrace(error="reads done in C"), None), (LoadTrace(), None)):
            target, choice = choose(fault, str(tmp_path), newest, trace, why)
            assert target == old and choice["by"] == "seeded" and choice["why"].startswith("no load traced")
    assert "reads done in C" in choose(parse_fault("zero:step=9"), str(tmp_path), newest,
                                       LoadTrace(error="reads done in C"))[1]["why"]


def test_an_environment_never_bound_to_a_plan_corrupts_as_before_and_says_so(tmp_path: Path) -> None:
    scratch = tmp_path / "scenario"
    root = scratch / "ckpt"
    files = _tree(root)
    (scratch / "logs").mkdir()
    env = Environment([], 2, str(root), str(scratch / "logs"), 4)
    rec = env.corrupt(parse_fault("truncate:step=9,seed=2,fraction=0.5"), [])
    everything = sorted(os.path.relpath(p, root) for p in files.values())
    assert rec["changed"] and rec["target"] == random.Random("2:truncate:target").choice(everything)
    assert rec["choice"]["by"] == "seeded" and "launch plan was not handed" in rec["choice"]["why"]


# ---------------------------------------------------------------------- the campaign, fabricated
class _Record(RunRecord):
    """A run record holding one at-rest fault's record, as the environment writes it."""

    def __init__(self, corruption: dict[str, Any]) -> None:
        super().__init__(2, [{"attempt": 0, "outcome": "ok", "fired": [
            {"index": 0, "spec": "x", "kind": corruption["kind"], "detail": {"corruption": corruption}}]}])


def test_a_campaign_sweeps_payloads_and_corruptions_over_every_kind_the_load_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = ["latest", MANIFEST_KIND, "step-*/rank*.pt"]
    ran: list[list[str]] = []

    def run_one(schedule: list[str]) -> ScenarioResult:
        ran.append(schedule)
        fault = parse_fault(schedule[0])
        Scenario("reference", faults=[fault]).validate()
        if fault.family != "rest":
            return ScenarioResult(Scenario("reference"), "pass")
        hit = fault.param("file") or kinds[0]
        assert hit in kinds, schedule  # a drawn at-rest fault aims at a kind the load read, or at none
        corruption = {"kind": fault.kind, "changed": True,
                      "choice": {"kinds": kinds, "kind": hit, "by": "first read"}}
        return ScenarioResult(Scenario("reference"), "pass", record=_Record(corruption))

    cfg = WorkloadConfig(steps=40, save_every=5, seed=4)
    points = TracePoints()
    clock = [0.0]

    def estimate() -> float:
        clock[0] += 1.0
        return 1.0

    import chaos.run.campaign as campaign_mod

    monkeypatch.setattr(campaign_mod.time, "monotonic", lambda: clock[0])  # a fake clock the estimate advances
    done = fill_budget(cfg, 2, points, deadline=300.0, run_one=run_one, estimate_s=estimate, max_schedules=300)
    monkeypatch.undo()
    sweep = [s[0].split(":")[0] + (":" + parse_fault(s[0]).param("file") if parse_fault(s[0]).param("file") else "")
             for s in ran[:6]]
    assert sweep == ["truncate", f"payload:{kinds[0]}", f"payload:{kinds[1]}", f"payload:{kinds[2]}",
                     f"truncate:{kinds[1]}", f"bitflip:{kinds[2]}"]
    assert list(read_sweep(cfg, ReadCoverage()))[0] == [ran[0][0]]  # seeded: the same seed sweeps the same way
    entry = done.reads.to_dict()
    assert entry["payload"] == kinds and entry["corruption"] == kinds and not entry["payload_untried"]
    assert "payloads reached 3 of 3, corruptions 3 of 3" in done.reads.summary()
    drawn = [parse_fault(f) for s in ran[6:] for f in s]
    assert any(f.kind == "payload" and f.param("file") == MANIFEST_KIND for f in drawn), \
        "the drawn schedules never aimed a payload at the manifest"


def test_a_stale_copy_is_drawn_only_from_files_with_an_older_copy(tmp_path: Path) -> None:
    """The first file read is often a pointer in the root (``latest``), which has no older copy:
    a stale fault must skip it, as bitflip skips a file without a data region, or do nothing."""
    for seed in range(8):
        scratch = tmp_path / f"scenario{seed}"
        root = scratch / "ckpt"
        _tree(root)
        (scratch / "logs").mkdir()
        env = Environment([], 2, str(root), str(scratch / "logs"), 4)
        rec = env.corrupt(parse_fault(f"stale:step=9,seed={seed}"), [])
        assert rec["changed"], rec
        assert rec["target"] not in ("latest", "step-00000008/notes.txt"), rec
        assert rec["target"] in rec["choice"]["among"]
