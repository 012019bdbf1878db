"""Retention and candidate ordering on a fake file system (pyfakefs): which steps survive,
which the loader tries first, and that a deletion is never half-visible.

These are the pure-Python decisions behind the reference checkpointer's save and load
paths, driven through the same public functions the engine calls after a commit
(``policy.select_for_deletion`` over ``store.list_steps()``, then ``store.hide_step``)
and before a load (``loader.candidate_order``), on directory layouts built in memory.
"""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.reference.checkpoint.loader import candidate_order
from chaos.reference.checkpoint.options import Milestones, parse_options
from chaos.reference.checkpoint.policy import select_for_deletion
from chaos.reference.ckptformat import commit
from chaos.reference.storage.posix import PosixStorage

ROOT = "/ckpt"


def _layout(fs, steps, latest=None, extra=()):
    for s in steps:
        fs.create_file(f"{ROOT}/{commit.step_dirname(s)}/manifest.json", contents="{}")
        fs.create_file(f"{ROOT}/{commit.step_dirname(s)}/shard-r00000.safetensors", contents=b"\0" * 16)
    if latest is not None:
        fs.create_file(f"{ROOT}/latest", contents=latest if isinstance(latest, str) else commit.step_dirname(latest) + "\n")
    for name in extra:
        if name.endswith("/"):
            fs.create_dir(f"{ROOT}/{name}")
        else:
            fs.create_file(f"{ROOT}/{name}", contents="x")
    return PosixStorage(ROOT)


def _retain(store, current, **options):
    """What the engine does on rank 0 after committing ``current``."""
    opts = parse_options(**options)
    doomed = select_for_deletion(store.list_steps(), current, opts.keep_last, opts.milestones)
    return doomed, [store.hide_step(s) for s in doomed]


def test_retention_keeps_the_newest_and_the_milestones_and_hides_before_removing(fs):
    store = _layout(fs, [10, 20, 30, 40, 50, 60], latest=60)
    doomed, removers = _retain(store, 60, keep_last="2", milestones="every-20")  # strings, as from the CLI
    assert doomed == [10, 30]
    # Hidden at once (no loader lists them), files still there until the removal runs.
    assert store.list_steps() == [60, 50, 40, 20]
    hidden = sorted(n for n in os.listdir(ROOT) if n.startswith(".del-"))
    assert len(hidden) == 2 and all(os.listdir(f"{ROOT}/{h}") for h in hidden)
    for remove in removers:
        remove()
    assert sorted(os.listdir(ROOT)) == ["latest"] + [commit.step_dirname(s) for s in (20, 40, 50, 60)]
    assert candidate_order(ROOT) == [60, 50, 40, 20]


def test_retention_leaves_an_abandoned_newer_timeline_alone(fs):
    # Resumed from 20 after 30 and 40 were rejected; the new save of 25 just committed.
    store = _layout(fs, [10, 20, 25, 30, 40], latest=25)
    doomed, removers = _retain(store, 25, keep_last=1)
    for remove in removers:
        remove()
    assert doomed == [10, 20]
    assert store.list_steps() == [40, 30, 25]
    assert candidate_order(ROOT) == [25, 40, 30], "latest first, the abandoned newer ones last"


def test_retention_before_the_commit_deletes_nothing(fs):
    store = _layout(fs, [10, 20, 30], latest=30)
    assert _retain(store, 40, keep_last=1) == ([], [])
    assert store.list_steps() == [30, 20, 10]


def test_explicit_milestones_survive_any_keep_last(fs):
    store = _layout(fs, [5, 10, 15, 20, 25], latest=25)
    doomed, removers = _retain(store, 25, keep_last=1, milestones="5,15")
    for remove in removers:
        remove()
    assert doomed == [10, 20] and store.list_steps() == [25, 15, 5]


@given(steps=st.sets(st.integers(0, 10**6), max_size=30), current=st.integers(0, 10**6),
       keep_last=st.integers(-2, 8), every=st.none() | st.integers(1, 50), fixed=st.frozensets(st.integers(0, 10**6), max_size=5))
def test_retention_never_deletes_what_must_stay(steps, current, keep_last, every, fixed):
    milestones = Milestones(steps=fixed, every=every)
    doomed = select_for_deletion(steps, current, keep_last, milestones)
    assert set(doomed) <= set(steps) and doomed == sorted(doomed)
    if current not in steps:
        assert doomed == []
        return
    timeline = sorted((s for s in steps if s <= current), reverse=True)
    assert current not in doomed
    assert not set(doomed) & set(timeline[: max(1, keep_last)]), "the newest keep_last of the timeline stay"
    assert not [s for s in doomed if s in milestones or s > current]
    # Everything else older than the kept window goes: retention is not a no-op.
    assert set(doomed) == {s for s in timeline[max(1, keep_last):] if s not in milestones}


@pytest.mark.parametrize("latest, expected", [
    (30, [30, 20, 10, 40]),                 # latest first, older newest first, newer last
    (None, [40, 30, 20, 10]),               # no pointer: newest first
    (50, [40, 30, 20, 10]),                 # pointer to a step that is not there
    ("garbage\n", [40, 30, 20, 10]),        # malformed pointer: ignored, with a warning
    ("../../etc/passwd\n", [40, 30, 20, 10]),
    ("x" * 300, [40, 30, 20, 10]),          # oversized pointer
])
def test_candidate_order(fs, caplog, latest, expected):
    _layout(fs, [10, 20, 30, 40], latest=latest)
    with caplog.at_level(logging.WARNING, logger="chaos.reference.checkpoint"):
        assert candidate_order(ROOT) == expected
    assert any("ignoring the latest pointer" in r.getMessage() for r in caplog.records) == isinstance(latest, str)


def test_only_published_step_directories_are_candidates(fs):
    _layout(fs, [10, 20], latest=20, extra=[
        ".tmp-step-0000000030-abc/", ".old-step-0000000040-def/", ".del-step-0000000050-0a1/",
        "step-0000000060",            # a file, not a directory
        "step-abc/", "step-/", "Step-0000000070/", "step-0000000080.bak/", "metrics.prom",
    ])
    assert candidate_order(ROOT) == [20, 10]
    assert PosixStorage(ROOT).list_steps() == [20, 10]


def test_an_empty_or_missing_root_has_no_candidates(fs):
    assert candidate_order("/nowhere") == []
    fs.create_dir(ROOT)
    assert candidate_order(ROOT) == []
    assert not os.path.exists("/nowhere"), "looking must not create the root"
