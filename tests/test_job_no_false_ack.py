"""``no_false_ack`` for a job (#28: the built-in workload's oracle, asked of a job's trace).

An injected error (an errno point) that hit data the save in progress had made
(``probe.saving(n, state)`` began it) must not be followed by ``probe.saved(n)`` in that
attempt, unless a later resume loaded that step; after a failed fsync of its data, never. The
same trace reader as the built-in's (``chaos.record.savescope.SaveScope``). Judged on traces
written here; the job corpus's ``swallows_errors.py`` runs for real in ``test_selfcheck_jobs``.
"""

from __future__ import annotations

from typing import Any

from chaos.judge.job import _no_false_ack
from chaos.launch.job import AttemptOutcome
from chaos.model.point import Point
from chaos.record.jobhistory import PointRecord

OUT = "/scratch/out"


def _probe(kind: str, n: int) -> dict[str, Any]:
    extra = {"sha256": "0" * 64} if kind in ("saving", "resumed") else {}
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": kind, "n": n, **extra}}


def _op(op: str, path: str, **kw: Any) -> dict[str, Any]:
    return {"event": "op", "op": op, "path": f"{OUT}/{path}", **kw}


def _fired(action: str, op: str, path: str, **kw: Any) -> dict[str, Any]:
    return {"event": "fired", "action": action, "op": op, "path": f"{OUT}/{path}", **kw}


def _save(n: int, error: dict[str, Any] | None, ack: bool = True) -> list[dict[str, Any]]:
    """A save of step n through a temp file: saving, open, write (or the error), fsync, rename, saved."""
    recs = [_probe("saving", n), _op("open", f"ckpt-{n}.tmp", created=True, mode="w")]
    recs.append(error if error is not None and error["op"] == "write" else _op("write", f"ckpt-{n}.tmp"))
    recs.append(error if error is not None and error["op"] == "fsync" else _op("fsync", f"ckpt-{n}.tmp"))
    recs += [_op("rename", f"ckpt-{n}.json", src=f"{OUT}/ckpt-{n}.tmp", dst=f"{OUT}/ckpt-{n}.json")]
    return recs + ([_probe("saved", n)] if ack else [])


def _record(traces: dict[tuple[int, int], list[dict[str, Any]]]) -> PointRecord:
    return PointRecord(Point(0, "eio", op=3), OUT, [AttemptOutcome(0, []), AttemptOutcome(1, [])], traces)


def test_acknowledging_a_save_an_error_hit_fails() -> None:
    got = _no_false_ack(_record({(0, 0): _save(3, None) + _save(6, _fired("eio", "write", "ckpt-6.tmp"))}))
    assert got is not None and got.result == "fail", got
    assert got.summary == ("rank 0 acknowledged its save of step 6 (probe.saved) although it failed: eio at the write "
                           "of ckpt-6.tmp")


def test_after_a_failed_fsync_even_a_load_of_that_step_is_no_excuse() -> None:
    traces = {(0, 0): _save(6, _fired("fsync_fail", "fsync", "ckpt-6.tmp")), (0, 1): [_probe("resumed", 6)]}
    got = _no_false_ack(_record(traces))
    assert got is not None and got.result == "fail" and "an fsync of its data failed" in got.summary


def test_a_retry_that_worked_and_an_error_not_acknowledged_pass() -> None:
    retried = {(0, 0): _save(6, _fired("eio", "write", "ckpt-6.tmp")), (0, 1): [_probe("resumed", 6)]}
    got = _no_false_ack(_record(retried))
    assert got is not None and got.result == "pass", got
    dead = _no_false_ack(_record({(0, 0): _save(6, _fired("eio", "write", "ckpt-6.tmp"), ack=False)}))
    assert dead is not None and dead.result == "pass" and dead.summary == "1 injured save(s), none acknowledged falsely"


def test_an_error_after_the_acknowledgement_or_outside_the_save_is_no_lie() -> None:
    after = _save(6, None) + [_op("open", "final.tmp", created=True, mode="w"), _fired("eio", "write", "final.tmp")]
    got = _no_false_ack(_record({(0, 0): after}))
    assert got is not None and got.result == "pass", got
    read = _save(6, None)[:1] + [_fired("eio", "open", "data.bin", mode="r")] + _save(6, None)[1:]
    got = _no_false_ack(_record({(0, 0): read}))
    assert got is not None and got.result == "pass" and "1 injur(ies) of nothing the save in progress made" in got.summary


def test_not_asked_without_an_error_nor_of_a_kill_and_not_judged_without_a_save_announced() -> None:
    assert _no_false_ack(_record({(0, 0): _save(6, None)})) is None
    torn = PointRecord(Point(0, "torn", op=3), OUT, [AttemptOutcome(0, [])],
                       {(0, 0): _save(6, _fired("short_write", "write", "ckpt-6.tmp"), ack=False)})
    assert _no_false_ack(torn) is None  # a torn write's record, then the kill: nothing to acknowledge
    bare = [_op("open", "ckpt.tmp", created=True, mode="w"), _fired("eio", "write", "ckpt.tmp"), _probe("saved", 6)]
    got = _no_false_ack(_record({(0, 0): bare}))
    assert got is not None and got.result == "not_judged" and "announces no save as it begins" in got.summary
