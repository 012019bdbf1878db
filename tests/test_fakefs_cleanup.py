"""Cleanup of crashed saves' leftovers on a fake file system (pyfakefs).

Who removes what: ``commit.clean_stale`` (through ``PosixStorage.clean_stale``, run by
rank 0 when a checkpointer is constructed) removes the ``.tmp-``, ``.old-`` and ``.del-``
names a crash can leave; ``PosixStorage.roll_back`` undoes a publish that failed halfway;
:class:`~chaos.reference.checkpoint.metrics.Metrics` removes the textfile temp of a writer that died.
Checked here: exactly those go, and every committed checkpoint, the pointer and every
name that merely looks similar stay.
"""

from __future__ import annotations

import os

from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.checkpoint.loader import candidate_order
from chaos.reference.checkpoint.metrics import Metrics
from chaos.reference.ckptformat import commit
from chaos.reference.storage.posix import PosixStorage

ROOT = "/ckpt"
# Far above any Linux pid_max (2**22): no such process.
DEAD_PID = 2**22 + 12345

LEFTOVERS = [
    ".tmp-step-0000000030-0123456789ab/",   # a save that never published
    ".tmp-latest-0123456789ab",             # a pointer update that never renamed
    ".old-step-0000000020-0123456789ab/",   # a re-save's old directory moved aside
    ".del-step-0000000010-0123456789ab/",   # a retention deletion halfway through
    ".tmp-dl-abc/",                         # an object store's download scratch
]
KEEP = [
    "step-0000000020/", "latest", "metrics.prom",
    "tmp-step-0000000040/", "step-0000000050.tmp-/", "notes.old-", "x.del-",   # look-alikes
]


def _make(fs, names):
    for n in names:
        if n.endswith("/"):
            fs.create_file(f"{ROOT}/{n}shard-r00000.safetensors", contents=b"\0" * 32)
        else:
            fs.create_file(f"{ROOT}/{n}", contents="step-0000000020\n" if n == "latest" else "x")


def _names():
    return sorted(n + "/" if os.path.isdir(f"{ROOT}/{n}") else n for n in os.listdir(ROOT))


def test_clean_stale_removes_exactly_the_leftovers(fs):
    _make(fs, LEFTOVERS + KEEP)
    removed = PosixStorage(ROOT).clean_stale()
    assert sorted(removed) == sorted(n.rstrip("/") for n in LEFTOVERS)
    assert _names() == sorted(KEEP)
    assert candidate_order(ROOT) == [20]


def test_clean_stale_spares_the_save_in_progress(fs):
    _make(fs, LEFTOVERS)
    mine = LEFTOVERS[0].rstrip("/")
    commit.clean_stale(ROOT, keep=mine)
    assert _names() == [LEFTOVERS[0]]


def test_clean_stale_on_a_missing_root_creates_nothing(fs):
    assert commit.clean_stale("/nowhere") == [] and not os.path.exists("/nowhere")


def test_rank_0_cleans_at_construction(fs):
    _make(fs, LEFTOVERS + KEEP + [f"metrics.prom.{DEAD_PID}.1"])
    c = ReferenceCheckpointer(ROOT, 0, 1)
    c.close()
    assert _names() == sorted(KEEP), "crash leftovers and a dead writer's metrics temp are gone"


def test_a_metrics_temp_of_a_live_writer_and_other_names_stay(fs):
    live = f"metrics.prom.{os.getpid()}.7"  # this very process: in progress, not stale
    _make(fs, [live, f"metrics.prom.{DEAD_PID}.7", "metrics.prom.1.x", "metrics.prom.bak"])
    Metrics(ROOT, 1)  # rank 1 writes no textfile and removes nothing
    assert len(os.listdir(ROOT)) == 4
    Metrics(ROOT, 0)
    assert _names() == sorted([live, "metrics.prom.1.x", "metrics.prom.bak"])


def test_roll_back_of_a_publish_that_renamed_but_did_not_update_latest(fs):
    _make(fs, ["step-0000000020/", "latest", "step-0000000030/", ".tmp-latest-0123456789ab"])
    store = PosixStorage(ROOT)
    store.roll_back(30, ".tmp-step-0000000030-0123456789ab", previous=20)
    assert _names() == ["latest", "step-0000000020/"]
    assert store.read_latest() == 20 and candidate_order(ROOT) == [20]


def test_roll_back_after_latest_moved_points_it_back(fs):
    _make(fs, ["step-0000000020/", "step-0000000030/"])
    fs.create_file(f"{ROOT}/latest", contents="step-0000000030\n")
    store = PosixStorage(ROOT)
    store.roll_back(30, ".tmp-step-0000000030-0123456789ab", previous=20)
    assert store.read_latest() == 20 and store.list_steps() == [20]


def test_roll_back_before_the_rename_only_drops_the_temp_dir(fs):
    _make(fs, ["step-0000000020/", "latest", ".tmp-step-0000000030-0123456789ab/"])
    store = PosixStorage(ROOT)
    store.roll_back(30, ".tmp-step-0000000030-0123456789ab", previous=20)
    assert _names() == ["latest", "step-0000000020/"] and store.read_latest() == 20
