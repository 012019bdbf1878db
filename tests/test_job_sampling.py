"""Which points a sample runs first (``pointset.point_classes``, ``pointset.plan``): pure, on hand-made traces.

A sample under ``--max-points`` or ``--budget`` takes one point of every class before any
seeded draw: every family, each save's end, each checkpoint file's first and last write,
and a kill after the last save (issue #34, item 14: a uniform shuffle left out every
corruption point and the full disk, and the kill after the last checkpoint that broke a
real job). Same seed, same order.
"""

from __future__ import annotations

from typing import Any

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec, Point
from chaos.plan import pointset
from chaos.plan.pointset import Facts, enumerate_points, sample

ROOT = "/o/"
KINDS = ("kill", "corrupt", "power", "errno", "term")
JOB = JobSpec(command=("python", "t.py", "{out}"), result_globs=("final.json",))


class Trace:
    """Records of one rank's attempt 0, numbered and timed in the order they are added."""

    def __init__(self) -> None:
        self.recs: list[dict[str, Any]] = []
        self.ord = 0

    def _ts(self) -> float:
        return float(len(self.recs) + 1)

    def op(self, op: str, rel: str, **kw: Any) -> int:
        path = rel if rel.startswith("/") else ROOT + rel
        rec = {"event": "op", "op": op, "ord": self.ord, "path": path, "ts": self._ts(), **kw}
        if not rel.startswith("/"):
            rec["rel"] = rel
        self.recs.append(rec)
        self.ord += 1
        return rec["ord"]

    def phase(self, kind: str, n: int) -> None:
        self.recs.append({"event": "phase", "name": "chaos.probe", "info": {"kind": kind, "n": n}, "ts": self._ts()})

    def write_file(self, rel: str, chunks: int = 2) -> tuple[int, int, int]:
        """open (truncating), ``chunks`` writes, close: (first write, last write, close)."""
        self.op("open", rel, mode="w", trunc=True)
        writes = [self.op("write", rel, length=10) for _ in range(chunks)]
        return writes[0], writes[-1], self.op("close", rel)


def two_file_job() -> tuple[dict[tuple[int, int], list[dict[str, Any]]], dict[str, Any]]:
    """Two saves of opt.json then model.json, written in place (a mixed-epoch job), then final.json."""
    t = Trace()
    at: dict[str, Any] = {}
    for save, steps in enumerate(((1, 2, 3), (4, 5, 6))):
        for n in steps:
            t.phase("step", n)
        at[f"opt{save}"] = t.write_file("opt.json")
        at[f"model{save}"] = t.write_file("model.json")
        t.phase("saved", steps[-1])
    t.phase("step", 7)
    at["final"] = t.write_file("final.json", 1)
    return {(0, 0): t.recs}, at


def points_of(traces: dict[tuple[int, int], list[dict[str, Any]]], job: JobSpec = JOB,
              files: tuple[str, ...] = ("final.json", "model.json", "opt.json")) -> list[Point]:
    return enumerate_points(job, traces, Facts(files=list(files)), KINDS)


def keys(classes: list[pointset.PointClass]) -> list[str]:
    return [c.key for c in classes]


# ---------------------------------------------------------------------------------- the classes
def test_a_two_file_save_gives_each_file_a_first_and_last_write_and_each_save_an_end() -> None:
    traces, at = two_file_job()
    points = points_of(traces)
    classes = pointset.point_classes(JOB, traces, points)
    assert keys(classes) == [
        *(f"family:{k}" for k in KINDS), "after-last-save",
        f"save-end:rank0:op{at['model0'][2]}", f"save-end:rank0:op{at['model1'][2]}",
        "first-write:model.json", "last-write:model.json", "first-write:opt.json", "last-write:opt.json"]
    by_key = {c.key: c for c in classes}
    assert {points[i].op for i in by_key["first-write:opt.json"].members} == {at["opt0"][0]}
    assert {points[i].op for i in by_key["last-write:opt.json"].members} == {at["opt1"][1]}
    assert {points[i].op for i in by_key["last-write:model.json"].members} == {at["model1"][1]}
    # the moment after the last save: kills only, each striking once model.json's last close is done
    after = [points[i] for i in by_key["after-last-save"].members]
    last_close = at["model1"][2]
    assert after and {p.family for p in after} == {"kill"}
    assert all(p.step == 7 if p.op is None else p.op > last_close or p.op == last_close and p.mode == "after"
               for p in after)
    assert Point(0, "after", op=last_close).id in {p.id for p in after}
    # final.json is the result, not a checkpoint: no write class, no save end
    assert not any("final.json" in c.key or f"op{at['final'][2]}" in c.key for c in classes)


def test_a_checkpoint_moved_aside_to_be_deleted_keeps_the_name_it_was_saved_under() -> None:
    """Retention that renames step-2 to .del-step-2-<nonce> and deletes it there (the reference's):
    step-2's writes are still of step-2/..., not of a random name no other run has."""
    t = Trace()
    for step in (2, 4):
        t.phase("step", step)
        t.op("mkdir", f".tmp-{step}")
        t.write_file(f".tmp-{step}/shard.bin", 1)
        t.op("rename", f"step-{step}", src=ROOT + f".tmp-{step}")
        t.phase("saved", step)
    t.op("rename", ".del-step-2-1f3a", src=ROOT + "step-2")  # aside, then removed
    t.op("unlink", ".del-step-2-1f3a/shard.bin")
    t.op("rmdir", ".del-step-2-1f3a")
    t.write_file("final.json", 1)
    traces = {(0, 0): t.recs}
    classes = pointset.point_classes(JOB, traces, points_of(traces, files=("final.json", "step-4/shard.bin")))
    writes = [k for k in keys(classes) if k.startswith("first-write:")]
    assert writes == ["first-write:step-2/shard.bin", "first-write:step-4/shard.bin"]
    ends = [c.what for c in classes if c.key.startswith("save-end:")]
    assert len(ends) == 2 and all("rename of step-" in w for w in ends), ends  # the move aside ends no save


def test_a_temp_file_renamed_into_place_is_written_as_its_checkpoint_and_the_rename_ends_the_save() -> None:
    t = Trace()
    t.phase("step", 1)
    t.write_file("ckpt-1.json.tmp", 1)
    first_rename = t.op("rename", "ckpt-1.json", src=ROOT + "ckpt-1.json.tmp")
    t.phase("saved", 1)
    t.phase("step", 2)
    t.op("mkdir", "tmp-2")
    only_write = t.write_file("tmp-2/model.bin", 1)[0]
    dir_rename = t.op("rename", "step-2", src=ROOT + "tmp-2")
    t.phase("step", 3)
    moved_in = t.write_file("/tmp/job/tmpab12", 1)[0]  # written in $TMPDIR, then moved in (Lightning)
    last_rename = t.op("rename", "last.ckpt", src="/tmp/job/tmpab12")
    t.op("unlink", "ckpt-1.json")  # rotated away: still a checkpoint the job saved
    t.phase("step", 4)
    t.write_file("final.json.tmp", 1)
    t.op("rename", "final.json", src=ROOT + "final.json.tmp")
    traces = {(0, 0): t.recs}
    classes = pointset.point_classes(JOB, traces, points_of(traces, files=("final.json", "last.ckpt",
                                                                             "step-2/model.bin")))
    assert keys(classes)[len(KINDS):] == [
        "after-last-save", f"save-end:rank0:op{first_rename}", f"save-end:rank0:op{dir_rename}",
        f"save-end:rank0:op{last_rename}", "first-write:ckpt-1.json", "first-write:last.ckpt",
        "first-write:step-2/model.bin"]
    by_key = {c.key: c for c in classes}
    assert "only write of checkpoint file step-2/model.bin" in by_key["first-write:step-2/model.bin"].what
    assert f"event {only_write}, write of tmp-2/model.bin" in by_key["first-write:step-2/model.bin"].what
    assert f"event {moved_in}, write of /tmp/job/tmpab12" in by_key["first-write:last.ckpt"].what


def test_completions_between_two_announcements_are_one_save_and_without_any_each_is_one() -> None:
    t = Trace()
    t.phase("step", 1)
    t.write_file("a.pt", 1)
    b_close = t.write_file("b.pt", 1)[2]
    t.phase("step", 2)
    traces = {(0, 0): t.recs}
    ends = [c.key for c in pointset.point_classes(JOB, traces, points_of(traces, files=("a.pt", "b.pt")))
            if c.kind == pointset.SAVE_END]
    assert ends == [f"save-end:rank0:op{b_close}"]
    silent = {(0, 0): [r for r in t.recs if r["event"] == "op"]}  # no probe, no --step-regex
    ends = [c.key for c in pointset.point_classes(JOB, silent, points_of(silent, files=("a.pt", "b.pt")))
            if c.kind == pointset.SAVE_END]
    assert ends == ["save-end:rank0:op2", f"save-end:rank0:op{b_close}"]


def test_the_checkpoint_glob_decides_which_files_are_checkpoints() -> None:
    t = Trace()
    t.phase("step", 1)
    t.write_file("ckpt-1.json", 1)
    t.write_file("log.txt", 1)
    t.phase("step", 2)
    traces = {(0, 0): t.recs}
    job = JobSpec(command=("python", "t.py", "{out}"), checkpoint_glob="ckpt-*.json")
    classes = pointset.point_classes(job, traces, points_of(traces, job, ("ckpt-1.json", "log.txt")))
    assert [k for k in keys(classes) if not k.startswith("family:")] == [
        "after-last-save", "save-end:rank0:op2", "first-write:ckpt-1.json"]


def test_after_the_last_save_means_after_every_rank_s_last_save() -> None:
    r0, r1 = Trace(), Trace()
    r0.phase("step", 1)
    r0.write_file("r0.pt", 1)
    r0.phase("step", 2)
    r0.op("mkdir", "logs")
    r0.recs[-1]["ts"] = 10.0  # rank 0's last event comes after everything
    r1.phase("step", 1)
    r1.write_file("r1.pt", 1)
    r1.phase("step", 2)
    for rec in r1.recs:
        rec["ts"] += 0.5  # rank 1 closes its checkpoint after rank 0 closed its own
    traces = {(0, 0): r0.recs, (1, 0): r1.recs}
    points = points_of(traces, files=("r0.pt", "r1.pt"))
    [after] = [c for c in pointset.point_classes(JOB, traces, points) if c.key == "after-last-save"]
    # not rank 0's kill right after its own close (op2): rank 1 was still saving then
    assert sorted(points[i].id for i in after.members) == [
        "rank0:op3:after", "rank0:op3:before", "rank0:step2:kill", "rank1:op2:after", "rank1:step2:kill"]


# ---------------------------------------------------------------------------------- the order
ISSUE_MIX = {"kill": 49, "corrupt": 8, "power": 57, "errno": 24, "term": 12, "diskfull": 1}


def issue_points() -> list[Point]:
    """The issue's job: 151 points, 8 of them corruptions and one full disk."""
    modes = {"kill": "after", "corrupt": "bitflip", "power": "power", "errno": "eio"}
    out: list[Point] = []
    for fam, n in ISSUE_MIX.items():
        for i in range(n):
            if fam == "term":
                out.append(Point(0, "term", step=i))
            elif fam == "diskfull":
                out.append(Point(0, "diskfull", size=4096))
            else:
                out.append(Point(0, modes[fam], op=i))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_a_budget_runs_one_point_of_every_family_before_a_second_of_any(seed: int) -> None:
    # --budget alone: every point in the order they run until the time is up
    order = sample(issue_points(), None, seed)
    assert sorted(p.family for p in order[:len(ISSUE_MIX)]) == sorted(ISSUE_MIX)
    assert sorted(p.id for p in order) == sorted(p.id for p in issue_points())
    assert [p.id for p in sample(issue_points(), None, seed)] == [p.id for p in order]


def test_the_old_spread_over_the_families_still_holds_after_the_classes() -> None:
    points = [Point(0, "after", op=i) for i in range(40)] + [Point(0, "power", op=i) for i in range(3)] + [
        Point(0, "term", step=i) for i in range(10)]
    assert sorted(p.family for p in sample(points, 9, seed=1)) == ["kill"] * 3 + ["power"] * 3 + ["term"] * 3


@pytest.mark.parametrize("seed", range(6))
def test_a_sample_covers_every_class_before_it_draws_more(seed: int) -> None:
    traces, _ = two_file_job()
    points = points_of(traces)
    classes = pointset.point_classes(JOB, traces, points)
    whole = pointset.plan(points, None, seed, classes)
    assert whole.needed == whole.reps <= len(classes)
    head = pointset.plan(points, whole.needed, seed, classes)
    assert [p.id for p in head.points] == [p.id for p in whole.points[:whole.needed]]
    assert head.covered(head.points) == (classes, [])  # every class has a point among the first ones
    assert [p.id for p in pointset.plan(points, None, seed, classes).points] == [p.id for p in whole.points]
    # a representative of a place (a save's end, a write) is taken from the family with the fewest
    # so far, so the families interleave
    counts = {f: sum(1 for p in head.points if p.family == f) for f in ("kill", "power", "errno")}
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_a_sample_smaller_than_the_families_takes_each_at_most_once_and_says_what_it_left_out() -> None:
    traces, _ = two_file_job()
    points = points_of(traces)
    classes = pointset.point_classes(JOB, traces, points)
    plan = pointset.plan(points, 3, 5, classes)
    assert len({p.family for p in plan.points}) == 3
    [note] = plan.planned_notes(3, None)
    left = [c for c in classes if not any(p.id in {points[i].id for i in c.members} for p in plan.points)]
    assert note.startswith(f"sample: --max-points 3 is fewer than the {plan.needed} point(s) that cover every "
                           f"point class; {len(left)} of {len(classes)} class(es) get no point: ")
    assert all(c.what in note for c in left[:8])
    assert any(c.kind == pointset.FAMILY for c in left)


def test_the_notes_say_which_classes_the_budget_never_reached() -> None:
    traces, _ = two_file_job()
    points = points_of(traces)
    classes = pointset.point_classes(JOB, traces, points)
    plan = pointset.plan(points, None, 2, classes)
    assert plan.planned_notes(None, 30.0) == [
        f"run order under --budget 30 s: the first {plan.reps} of the {len(points)} point(s) cover all "
        f"{len(classes)} point classes (5 families, the moment after the last save, 2 save ends, 2 first writes "
        "of checkpoint files, 2 last writes of checkpoint files), then seeded draws spread over the families"]
    tried = plan.points[:2]
    yes, no = plan.covered(tried)
    [note] = plan.tried_notes(tried, None, 30.0)
    assert note.startswith(f"point classes tried: {len(yes)} of {len(classes)}; not reached before the --budget "
                           "of 30 s ran out: ")
    assert all(c.what in note for c in no[:8]) and no
    assert plan.tried_notes(plan.points, None, 30.0) == [f"point classes tried: {len(classes)} of {len(classes)}"]
    assert plan.tried_notes(plan.points, None, None) == []  # every point run: nothing was sampled


# ---------------------------------------------------------------------------------- --checkpoint-glob
def test_a_star_in_the_checkpoint_glob_never_crosses_a_directory_as_glob_does_not() -> None:
    t = Trace()
    t.write_file("ckpt.pt", 1)
    t.write_file("sub/ckpt.pt", 1)
    traces = {(0, 0): t.recs}
    job = JobSpec(command=("python", "t.py", "{out}"), checkpoint_glob="*.pt")
    corrupted = {p.path for p in enumerate_points(job, traces, Facts(files=["ckpt.pt", "sub/ckpt.pt"]), ("corrupt",))}
    assert corrupted == {"ckpt.pt"}  # what explore.checkpoint_state's glob.glob matches, and the oracle counts


def test_a_checkpoint_glob_that_matches_nothing_the_run_left_is_a_usage_error() -> None:
    job = JobSpec(command=("python", "t.py", "{out}"), checkpoint_glob="{out}/*.pt")
    with pytest.raises(ConfigError, match=r"--checkpoint-glob '\{out\}/\*\.pt' matched no file the fault-free run "
                                          r"left under \{out\} \(it left \.hidden\.pt, sub/ckpt\.pt\)"):
        pointset.check_checkpoint_glob(job, ["sub/ckpt.pt", ".hidden.pt"])
    pointset.check_checkpoint_glob(job, ["sub/ckpt.pt", "top.pt"])
    pointset.check_checkpoint_glob(JobSpec(command=("t", "{out}"), checkpoint_glob="checkpoint-*"), ["checkpoint-5/a.bin"])
    pointset.check_checkpoint_glob(JobSpec(command=("t", "{out}")), [])  # no glob: nothing to check
