"""The replica check of async saves (``replicas=verify``) when it runs off the training thread.

An async save does not copy the replicated tensors another rank writes; it hashes them so
that one that silently stopped being identical across ranks aborts the save instead of
losing that rank's value. For the tensors an optimizer owns, ``replicas=verify`` hashes
them on the commit thread after ``save()`` returned, and every ``optimizer.step()`` waits
at a fence until that is done. These tests pin the guarantee on real gloo ranks:

- a replica that differs on one rank at ``save()`` fails that save on every rank, with
  nothing committed, even when the very next optimizer step would make it equal again
  (the case a check reading after the step could not tell apart); the step itself runs;
- without the fence the same schedule commits and loses that rank's value (so the test
  above can fail, and shows what the fence is for);
- an in-place update outside an optimizer step before the check finished refuses the
  save; ``wait_snapshot()`` first makes the same update safe, and its wait is stall.

Single-process tests cover which tensors are deferred, the version guard and the fence.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from ckpt_dist import check_all_ok, run_ranks

from chaos import phases
from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import CommitError, ReferenceCheckpointer
from chaos.reference.checkpoint.async_writer import Fence, OptimizerFence, Staging
from chaos.reference.checkpoint.options import parse_options
from chaos.reference.checkpoint.saver import Snapshot, _meta, finish_snapshot, take_snapshot
from chaos.reference.ckptformat.commit import list_steps, read_latest

pytestmark = pytest.mark.timeout(120)

OPTS = {"timeout_s": 20, "async_save": True}


class CopyFrom(torch.optim.Optimizer):
    """An optimizer whose step sets every parameter to a fixed target, through ``.data``.

    On a rank whose replica diverged, its step makes the replica equal to the writing
    rank's copy again: a check that read the replica after that step would see no
    divergence at all, and the rank's value at ``save()`` would be lost silently. Writing
    through ``.data`` (as older optimizers do) moves no version counter, so only the
    fence, not the version guard, can stop that.
    """

    def __init__(self, params: list[torch.nn.Parameter], targets: list[torch.Tensor]) -> None:
        super().__init__(params, {})
        self.targets = targets

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            for p, target in zip(group["params"], self.targets, strict=True):
                p.data.copy_(target)


def _training(rank: int) -> tuple[list[torch.nn.Parameter], list[torch.Tensor], CopyFrom, object]:
    gen = torch.Generator().manual_seed(0)  # identical parameters on every rank: DDP replicas
    params = [torch.nn.Parameter(torch.randn(512, generator=gen)) for _ in range(4)]
    targets = [p.detach().clone() for p in params]
    opt = CopyFrom(params, targets)

    def state() -> dict:
        return {"model": {f"w{i}": p.detach() for i, p in enumerate(params)}, "optimizer": opt.state_dict(),
                "rng": {"torch": torch.full((8,), rank, dtype=torch.uint8)}, "progress": {"step": 0}}

    return params, targets, opt, state


def _zeros(value: object) -> object:
    """A load template that shares no memory with the live state."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {k: _zeros(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_zeros(v) for v in value]
    return value


def _hold_replica_check(until: threading.Event, timeout: float, fired: list[int]):
    """A phase listener that keeps the commit thread from reading the deferred replicas until
    ``until`` is set or ``timeout`` passed (the fence keeps the training side waiting meanwhile).
    ``fired`` collects the steps whose replica check was deferred at all."""

    def listener(name: str, info: dict) -> None:
        if name == "replica_check":
            fired.append(info["step"])
            until.wait(timeout)

    return listener


def _diverge_then_step(rank: int, world: int, root: str, fenced: bool) -> dict:
    params, targets, opt, state = _training(rank)
    ckpt = ReferenceCheckpointer(root, rank, world, **OPTS)
    opt.step()  # the optimizer is known to the checkpointer's pre-hook from its first step
    if not fenced:
        ckpt._optimizer_fence.remove()  # what this test guards against: steps no longer wait
    ckpt.save(1, state())
    ckpt.wait()
    written_by_other = sorted(p for p in ckpt._skip if p.startswith("model/"))
    if rank == 1:
        with torch.no_grad():  # rank 1's replicas of the tensors rank 0 writes silently diverge
            for i, p in enumerate(params):
                if f"model/w{i}" in written_by_other:
                    p.add_(1.0)
    at_save = fingerprint(state())
    step_done, deferred = threading.Event(), []
    listener = _hold_replica_check(step_done, 3.0, deferred)
    phases.subscribe(listener)
    try:
        ckpt.save(2, state())
        opt.step()  # the next training step, at once: it makes rank 1's replicas equal to rank 0's again
        step_done.set()
        try:
            ckpt.wait()
            second = "committed"
        except CommitError as exc:
            second = str(exc)
    finally:
        phases.unsubscribe(listener)
    stepped = all(torch.equal(p.detach(), t) for p, t in zip(params, targets, strict=True))
    steps_after_2 = list_steps(root)
    found = ckpt.load_latest(_zeros(state()))
    loaded_2 = found is not None and found[0] == 2 and fingerprint(found[1]) == at_save
    ckpt.save(3, state())
    ckpt.wait()
    step3, loaded3 = ckpt.load_latest(_zeros(state()))
    ckpt.close()
    return {"second": second, "stepped": stepped, "steps_after_2": steps_after_2, "loaded_2_as_saved": loaded_2,
            "written_by_other": written_by_other, "deferred": deferred, "step3": step3,
            "step3_ok": fingerprint(loaded3) == fingerprint(state())}


def test_a_replica_diverged_at_save_fails_the_save_on_every_rank_though_the_next_step_hides_it(tmp_path):
    results = check_all_ok(run_ranks(_diverge_then_step, 2, str(tmp_path), True))
    assert results[1]["written_by_other"] and results[1]["deferred"] == [2], "rank 1's check was not deferred"
    for r in results:
        # Loud on every rank, naming a diverged tensor; nothing of step 2 was committed.
        assert "replication pattern changed" in r["second"] and "model/w" in r["second"], r["second"]
        assert r["steps_after_2"] == [1] and not r["loaded_2_as_saved"]
        assert r["stepped"], "the training step itself must run (only the commit is aborted)"
        assert r["step3"] == 3 and r["step3_ok"]  # the next save copies everything and commits
    assert read_latest(str(tmp_path)) == 3


def test_without_the_fence_the_same_schedule_loses_the_diverged_value_silently(tmp_path):
    """The hazard the fence removes: the check reads rank 1's replica after the step made it
    equal to rank 0's, step 2 commits, and rank 1 loads rank 0's value, not its own."""
    results = check_all_ok(run_ranks(_diverge_then_step, 2, str(tmp_path), False))
    assert [r["second"] for r in results] == ["committed", "committed"]
    assert [r["loaded_2_as_saved"] for r in results] == [True, False]


def _update_outside_a_step(rank: int, world: int, root: str, wait_first: bool) -> dict:
    params, _, opt, state = _training(rank)
    ckpt = ReferenceCheckpointer(root, rank, world, **OPTS)
    opt.step()
    ckpt.save(1, state())
    ckpt.wait()
    at_save = fingerprint(state())
    updated, deferred = threading.Event(), []
    listener = _hold_replica_check(updated, 2.0, deferred)
    phases.subscribe(listener)
    try:
        ckpt.save(2, state())
        waited = ckpt.wait_snapshot() if wait_first else 0.0
        with torch.no_grad():  # e.g. weight clipping done by hand: not an optimizer step
            for p in params:
                p.mul_(0.5)
        updated.set()
        try:
            ckpt.wait()
            second = "committed"
        except CommitError as exc:
            second = str(exc)
    finally:
        phases.unsubscribe(listener)
    found = ckpt.load_latest(_zeros(state()))
    stall = next(e["stall_s"] for e in ckpt.events if e["kind"] == "save" and e["step"] == 2)
    ckpt.close()
    return {"second": second, "latest": found[0], "as_saved": fingerprint(found[1]) == at_save, "waited": waited,
            "stall": stall, "deferred": deferred}


def test_an_in_place_update_outside_a_step_before_the_check_refuses_the_save_everywhere(tmp_path):
    results = check_all_ok(run_ranks(_update_outside_a_step, 2, str(tmp_path), False))
    for r in results:
        assert r["deferred"] == [2]
        assert "changed in place" in r["second"] and "wait_snapshot" in r["second"], r["second"]
        assert r["latest"] == 1


def test_wait_snapshot_makes_the_same_update_safe_and_its_wait_counts_as_stall(tmp_path):
    results = check_all_ok(run_ranks(_update_outside_a_step, 2, str(tmp_path), True))
    for r in results:
        assert r["second"] == "committed" and r["latest"] == 2 and r["as_saved"]
        assert r["waited"] > 0 and r["stall"] >= r["waited"]


def test_verify_sync_still_catches_a_changed_replication_pattern(tmp_path):
    from test_checkpoint_dist import _replication_changes

    results = check_all_ok(run_ranks(_replication_changes, 2, str(tmp_path), "verify-sync"))
    for second, step, ok in results:
        assert "replication pattern changed" in second and "data/shared" in second
        assert step == 3 and ok


# ----------------------------------------------------------------- one process
def _state(w: torch.Tensor, buf: torch.Tensor) -> dict:
    return {"model": {"w": w, "buf": buf}, "optimizer": {"state": {}, "param_groups": []}, "data": {"x": torch.ones(4)}}


def test_only_cpu_tensors_an_optimizer_owns_are_deferred_the_rest_hashed_before_return():
    w, buf = torch.randn(64), torch.randn(64)
    managed = {w.data_ptr(): w.numel() * w.element_size()}
    skip = frozenset({"model/w", "model/buf"})
    snap = take_snapshot(5, _state(w.detach(), buf), Staging(), skip, managed=managed)
    assert snap.error is None
    assert [path for path, _, _ in snap.deferred] == ["model/w"]
    assert snap.hashed_only == {"model/buf": _meta(buf)}  # a buffer: hashed before save() returned
    assert set(snap.tensors) == {"data/x"}  # neither copied
    finish_snapshot(snap)
    assert snap.error is None and snap.hashed_only["model/w"] == _meta(w) and not snap.deferred

    sync = take_snapshot(5, _state(w.detach(), buf), Staging(), skip, managed=None)  # replicas=verify-sync
    assert not sync.deferred and set(sync.hashed_only) == {"model/w", "model/buf"}
    trust = take_snapshot(5, _state(w.detach(), buf), Staging(), skip, trust=True, managed=managed)
    assert not trust.deferred and {v[0] for v in trust.hashed_only.values()} == {"trusted"}


def test_a_view_larger_than_the_optimizers_memory_or_an_inference_tensor_is_not_deferred():
    w = torch.randn(64)
    managed = {w.data_ptr(): 16}  # the optimizer owns only the first 4 floats
    snap = take_snapshot(1, _state(w, torch.zeros(1)), Staging(), frozenset({"model/w"}), managed=managed)
    assert not snap.deferred and "model/w" in snap.hashed_only
    with torch.inference_mode():
        inf = torch.randn(64)
    snap = take_snapshot(1, _state(inf, torch.zeros(1)), Staging(), frozenset({"model/w"}),
                         managed={inf.data_ptr(): 256})
    assert not snap.deferred and "model/w" in snap.hashed_only


def test_a_deferred_tensor_changed_in_place_before_its_check_fails_the_snapshot():
    w = torch.randn(64)
    snap = take_snapshot(7, _state(w.detach(), torch.zeros(1)), Staging(), frozenset({"model/w"}),
                         managed={w.data_ptr(): 256})
    assert snap.deferred
    w.mul_(2)  # version counter moves (shared with the detached alias the snapshot holds)
    finish_snapshot(snap)
    assert snap.error is not None and "model/w" in snap.error and "changed in place" in snap.error


def _at_the_fence(fence: Fence, call) -> threading.Thread:
    """``call`` on a thread of its own, once it waits at the (closed) ``fence``."""
    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while fence._waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fence._waiting == 1, "it never reached the fence"
    return thread


def test_the_optimizer_pre_hook_holds_a_step_until_the_fence_is_released_and_learns_the_optimizer():
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    hooks_before = len(_global_optimizer_pre_hooks)
    fence = Fence()
    guard = OptimizerFence(fence)
    p = torch.nn.Parameter(torch.zeros(8))
    p.grad = torch.ones(8)
    opt = torch.optim.SGD([p], lr=1.0)
    try:
        assert fence.wait() == 0.0  # open: returns at once
        fence.arm()
        stepper = _at_the_fence(fence, opt.step)
        assert torch.equal(p.detach(), torch.zeros(8)), "the step ran while the fence was closed"
        fence.release()
        stepper.join(30)
        assert torch.equal(p.detach(), -torch.ones(8))
        assert fence.take_waited() > 0 and fence.take_waited() == 0.0
        assert guard.managed() == {p.data_ptr(): 32}  # momentum-free SGD keeps no state tensors
    finally:
        guard.remove()
    assert len(_global_optimizer_pre_hooks) == hooks_before


def test_replicas_option_values_and_which_modes_register_the_pre_hook(tmp_path):
    assert parse_options(replicas="verify-sync").replicas == "verify-sync"
    with pytest.raises(TypeError, match="replicas"):
        parse_options(replicas="sometimes")
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    before = len(_global_optimizer_pre_hooks)
    for opts, hooked in (({"async_save": True}, True), ({"async_save": True, "replicas": "verify-sync"}, False),
                         ({"async_save": True, "replicas": "trust"}, False), ({}, False)):
        ckpt = ReferenceCheckpointer(str(tmp_path / "c"), 0, 1, metrics=False, **opts)
        assert (len(_global_optimizer_pre_hooks) == before + 1) is hooked, opts
        ckpt.close()
        assert len(_global_optimizer_pre_hooks) == before


def test_a_step_waiting_at_the_fence_hashes_the_pending_replicas_itself():
    """Waiting at the fence is never idle: the waiter takes the deferred hashes the commit
    thread has not reached, and the commit thread's result uses them."""
    from chaos.reference.checkpoint.saver import ReplicaCheck

    ws = [torch.randn(256) for _ in range(3)]
    state = {"model": {f"w{i}": w for i, w in enumerate(ws)}}
    snap = take_snapshot(9, state, Staging(), frozenset(f"model/w{i}" for i in range(3)),
                         managed={w.data_ptr(): 1024 for w in ws})
    check = ReplicaCheck(snap.deferred)
    fence = Fence()
    fence.arm(check.help)
    waiter = threading.Thread(target=fence.wait)
    waiter.start()
    deadline = time.monotonic() + 30
    while len(check.digests) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(check.digests) == 3, "the waiting thread did not hash the pending replicas"
    assert waiter.is_alive(), "the waiter must stay at the fence until it is released"
    finish_snapshot(snap, check)  # the commit thread: nothing left to hash, versions unchanged
    fence.release()
    waiter.join(30)
    assert snap.error is None and snap.hashed_only == {f"model/w{i}": _meta(w) for i, w in enumerate(ws)}
    assert fence.take_waited() > 0


def _three_deferred(sizes: tuple[int, ...] = (64, 512, 256)) -> tuple[list[torch.Tensor], Snapshot]:
    ws = [torch.randn(n) for n in sizes]
    state = {"model": {f"w{i}": w for i, w in enumerate(ws)}}
    snap = take_snapshot(9, state, Staging(), frozenset(f"model/w{i}" for i in range(len(ws))),
                         managed={w.data_ptr(): w.numel() * w.element_size() for w in ws})
    assert len(snap.deferred) == len(ws)
    return ws, snap


def test_a_waiter_reads_what_a_stalled_commit_thread_holds_and_opens_the_fence_itself():
    """With two ranks' training and commit threads on two cores, the commit thread often sits
    preempted in the middle of a replica. The waiter at the fence reads that one too (the bytes
    cannot change while it holds optimizer steps), completes the check and goes through; the
    commit thread then finds nothing left to read."""
    from chaos.reference.checkpoint.saver import ReplicaCheck

    ws, snap = _three_deferred()
    fence = Fence()
    check = ReplicaCheck(snap.deferred, on_complete=fence.open)
    fence.arm(check.help)
    with check._cond:
        held = check._claim()  # the commit thread took the largest first, then stalled in it
    assert held is not None and held[0] == "model/w1"
    waiter = threading.Thread(target=fence.wait)
    waiter.start()
    waiter.join(30)
    assert not waiter.is_alive(), "the waiter waited on the stalled commit thread"
    assert check.complete and not fence._closed
    finish_snapshot(snap, check)
    assert snap.error is None and snap.hashed_only == {f"model/w{i}": _meta(w) for i, w in enumerate(ws)}


def test_a_replica_changed_in_place_is_refused_whichever_thread_completes_the_check():
    from chaos.reference.checkpoint.saver import ReplicaCheck

    ws, snap = _three_deferred()
    fence = Fence()
    check = ReplicaCheck(snap.deferred, on_complete=fence.open)
    fence.arm(check.help)
    ws[0].add_(1)  # outside an optimizer step: the version counter moves
    assert fence.wait() > 0  # this thread reads them all and completes the check; the fence opens
    assert check.complete and not fence._closed and check.error is not None
    finish_snapshot(snap, check)
    assert snap.error is not None and "model/w0" in snap.error and "changed in place" in snap.error


def test_the_commit_thread_s_release_returns_once_the_waiters_are_through():
    """So a released training step gets the GIL at once, not after the commit thread's switch interval."""
    fence = Fence()
    fence.arm()
    waiter = _at_the_fence(fence, fence.wait)
    fence.release()
    assert fence._waiting == 0
    waiter.join(30)
    assert not waiter.is_alive() and fence.take_waited() > 0


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_the_commit_thread_never_preempts_the_training_thread_that_woke_it():
    """It runs under SCHED_BATCH (a fair share, no preemption on waking); the caller's thread is untouched."""
    from chaos.reference.checkpoint.async_writer import BackgroundCommit

    policies: list[int] = []
    commit = BackgroundCommit()
    try:
        commit.submit(lambda: policies.append(os.sched_getscheduler(0)))
        commit.join()
    finally:
        commit.stop()
    assert policies == [os.SCHED_BATCH] and os.sched_getscheduler(0) != os.SCHED_BATCH
