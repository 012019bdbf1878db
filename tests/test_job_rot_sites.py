"""Where corruption at rest strikes mid-run (``pointset.rot_sites``): pure, on hand-made traces.

A site is a file version the job trusted: completed by a close (or a rename into place)
and still there, unchanged, when the rank announced its next step.
"""

from __future__ import annotations

from typing import Any

from chaos.model.jobspec import JobSpec
from chaos.plan.pointset import enumerate_points, rot_sites

ROOT = "/o/"


def op(ord_: int, op_: str, rel: str, ts: float, **kw: Any) -> dict[str, Any]:
    return {"event": "op", "op": op_, "ord": ord_, "rel": rel, "path": ROOT + rel, "ts": ts, **kw}


def step(n: int, ts: float) -> dict[str, Any]:
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}, "ts": ts}


def sites(recs: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    return [(ev["ord"], rel, n) for ev, rel, n in rot_sites({(0, 0): recs})]


def test_a_file_rewritten_in_place_is_a_site_per_version_the_job_trusted() -> None:
    recs = [step(1, 1.0), op(0, "open", "last.ckpt", 1.1, trunc=True, flags=["wronly", "trunc"]),
            op(1, "close", "last.ckpt", 1.2), step(2, 2.0),
            op(2, "open", "last.ckpt", 2.1, trunc=True, flags=["wronly", "trunc"]), op(3, "close", "last.ckpt", 2.2),
            step(3, 3.0)]
    assert sites(recs) == [(1, "last.ckpt", 2), (3, "last.ckpt", 3)]


def test_a_file_removed_renamed_away_or_reopened_for_writing_before_the_step_is_no_site() -> None:
    recs = [step(1, 1.0),
            op(0, "close", "gone.json", 1.1), op(1, "unlink", "gone.json", 1.2),
            op(2, "close", "moved.tmp", 1.3), op(3, "rename", "moved.json", 1.4, src=ROOT + "moved.tmp"),
            op(4, "close", "busy.json", 1.5), op(5, "open", "busy.json", 1.6, flags=["rdwr"]),
            op(6, "close", "read.json", 1.7), op(7, "open", "read.json", 1.8, flags=["rdonly"]),
            step(2, 2.0)]
    # moved.tmp is gone, but the rename put moved.json in place: that one is a site
    assert sites(recs) == [(3, "moved.json", 2), (6, "read.json", 2)]


def test_a_directory_renamed_into_place_is_not_a_site_and_its_files_under_the_old_name_are_gone() -> None:
    recs = [step(1, 1.0), op(0, "open", "tmp-4", 1.05, is_dir=True), op(1, "close", "tmp-4", 1.06),
            op(2, "close", "tmp-4/model.bin", 1.1), op(3, "rename", "step-4", 1.2, src=ROOT + "tmp-4"),
            op(4, "close", "step-4.done", 1.3), step(2, 2.0)]
    assert sites(recs) == [(4, "step-4.done", 2)]


def test_nothing_after_the_last_step_and_the_last_completion_before_a_step_wins() -> None:
    recs = [step(1, 1.0), op(0, "close", "a.json", 1.1), op(1, "close", "a.json", 1.2), step(2, 2.0),
            op(2, "close", "final.json", 2.1)]
    assert sites(recs) == [(1, "a.json", 2)]


def test_sites_become_points_of_every_family_and_respect_the_checkpoint_glob() -> None:
    recs = [step(1, 1.0), op(0, "close", "ckpt-1.json", 1.1), op(1, "close", "log.txt", 1.2), step(2, 2.0)]
    job = JobSpec(command=("python", "t.py", "{out}"), checkpoint_glob="ckpt-*.json")
    from chaos.plan.pointset import Facts

    points = enumerate_points(job, {(0, 0): recs}, Facts(files=["ckpt-1.json"]), ("corrupt",))
    rot = [p.id for p in points if p.at_step is not None]
    assert rot == [f"rank0:op0:{fam}:step2" for fam in ("bitflip", "truncate", "zero", "delete")]


def test_a_file_moved_in_from_outside_the_output_directory_is_a_site() -> None:
    recs = [step(1, 1.0), op(0, "rename", "last.ckpt", 1.1, src="/tmp/job/tmpab12"), step(2, 2.0)]
    assert sites(recs) == [(0, "last.ckpt", 2)]
