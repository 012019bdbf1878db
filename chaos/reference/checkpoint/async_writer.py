"""Async save: a snapshot into reusable staging buffers, then a background commit.

``save()`` copies every tensor this rank writes into a CPU staging buffer (pinned when
the source is on CUDA, so the copy is a fast DMA) before it returns, so the caller may
update live tensors at once. Buffers are reused across saves when shapes and dtypes
match, so a steady-state save allocates nothing. One save at a time is in flight: the
next ``save()`` first joins the previous one; a background failure is kept and raised by
the next ``save()`` or ``wait()``.

Replicated tensors another rank writes are not copied; with ``replicas=verify`` their
bytes are still read (hashed) so that one that stopped being identical across ranks
aborts the save. For the tensors an optimizer owns (parameters, moments) that read is
*deferred* to the commit thread, and :class:`Fence` keeps the caller from changing them
until it is done: :class:`OptimizerFence` waits on it in a global optimizer-step
pre-hook, and ``ReferenceCheckpointer.wait_snapshot()`` waits on it for any other
update. Time spent waiting there is counted in the save's stall.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch


def _plain_cpu(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes may be copied as they lie: a dense, contiguous CPU tensor with no lazy conj/neg bit.

    :meth:`Staging.copy` copies such a tensor with libc's ``memmove`` (through ctypes,
    which lets go of the GIL) rather than ``Tensor.copy_``: 50 MB that no cache holds
    take about 8.2-9.6 ms against 8.6-10.8 ms for torch's element-wise copy kernel on
    this project's machines (2026-12-04), and that copy is most of an async save's
    stall. Anything else (CUDA, strided views, conj/neg views) goes through ``copy_``.
    """
    return (t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()
            and not t.is_conj() and not t.is_neg() and t.numel() > 0)


class Staging:
    """This rank's async staging buffers, one per tensor path, reused while shape and dtype hold.

    ``saver.take_snapshot`` calls :meth:`copy` on the training thread (from
    ``ReferenceCheckpointer.save``); the commit thread then writes from what it returned.
    """

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def copy(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        cuda = False
        for path, t in tensors.items():
            t = t.detach()
            buf = self.buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                pin = t.is_cuda and torch.cuda.is_available()
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
            cuda = cuda or t.is_cuda
            if _plain_cpu(t) and buf.is_contiguous():
                ctypes.memmove(buf.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
            else:
                buf.copy_(t, non_blocking=t.is_cuda)
            out[path] = buf
        if cuda:
            torch.cuda.synchronize()
        self.buffers = out
        return out


def _batch_policy() -> None:
    """Put the calling thread under Linux's ``SCHED_BATCH`` policy, where it exists.

    Why: when ``save()`` hands a commit to this thread, the woken thread used to preempt the
    training thread that woke it (the scheduler favours a thread that slept), so the
    optimizer step right after an async ``save()`` could wait a time slice (1.7-3.4 ms,
    in about a third of the saves at 100 MB, two ranks on two cores) before it even reached
    the fence. A ``SCHED_BATCH`` thread keeps its fair share of the CPU (the same weight as
    any other, so a busy training loop never starves the commit) but does not preempt on
    waking. Measured at 100 MB (2026-12-07, ``chaos bench --only reference-async,dcp-async
    --repeats 15``, three pairs of runs): median stall over its floor 1.22-1.23 with it,
    1.27-1.37 without. Unprivileged threads may switch to it; elsewhere nothing changes.
    """
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


class BackgroundCommit:
    """Runs one job at a time on a long-lived daemon thread and keeps its exception.

    The thread is started once, at the first job, and then fed through a queue: starting
    a thread per save made ``save()`` wait for the new thread to be scheduled and to give
    the GIL back (milliseconds, most of an async save's stall for small states).
    """

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()

    def _loop(self) -> None:
        _batch_policy()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self.error = exc
            finally:
                self._idle.set()

    def submit(self, job: Callable[[], None]) -> None:
        self.join()
        self._idle.clear()
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="chaos-ckpt-commit", daemon=True)
            self.thread.start()
        self._jobs.put(job)

    def join(self) -> None:
        self._idle.wait()

    def busy(self) -> bool:
        return not self._idle.is_set()

    def take_error(self) -> BaseException | None:
        err, self.error = self.error, None
        return err

    def stop(self) -> None:
        """Finish the job in flight, then end the thread."""
        self.join()
        if self.thread is not None and self.thread.is_alive():
            self._jobs.put(None)
            self.thread.join()
        self.thread = None


class Fence:
    """Closed while a save in flight still has to read live tensors it did not copy.

    ``save()`` arms it on the training thread when it deferred such reads; the thread that
    reads the last of them releases it (``saver.ReplicaCheck``), and the commit thread
    again in a ``finally``, so a failed read never leaves it closed. :meth:`wait` is what the training side calls before changing
    those tensors (the optimizer pre-hook, ``wait_snapshot()``): it first helps with the
    reads still pending, then blocks until the release. Every second spent there is
    stall caused by the save, summed in :meth:`take_waited` for its metrics.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._helper: Callable[[], None] | None = None
        self._waiting = 0
        self._waited = 0.0

    def arm(self, helper: Callable[[], None] | None = None) -> None:
        """Close the fence; a waiter first runs ``helper`` (the pending reads, shared) instead of idling."""
        with self._cond:
            self._closed = True
            self._helper = helper

    def open(self) -> None:
        """Open the fence and return at once (``saver.ReplicaCheck``'s completion, on whichever
        thread read the last replica: a waiter may call it)."""
        with self._cond:
            self._closed = False
            self._helper = None
            self._cond.notify_all()

    def release(self) -> None:
        """Commit thread: open the fence, then return once every waiter has left :meth:`wait`.

        Why wait for them: the commit thread goes on with the save's Python-heavy work, and a
        woken waiter needs the GIL, which CPython hands over when the holder blocks or after
        its switch interval (5 ms). Blocking here until the waiters are through lets them
        take it at once: measured at 100 MB (2026-12-07, ``chaos bench --repeats 15``, six
        runs each), the median stall over its floor was 1.18-1.27 with this wait and
        1.23-1.38 without.
        """
        self.open()
        with self._cond:
            while self._waiting and not self._closed:
                self._cond.wait()

    def wait(self) -> float:
        """Help with the pending reads, then block until released; the seconds it took (0.0 when open)."""
        with self._cond:
            if not self._closed:
                return 0.0
            helper = self._helper
            self._waiting += 1
        t0 = time.perf_counter()
        try:
            if helper is not None:
                helper()  # never raises (saver.ReplicaCheck.help): the caller's step must not fail
        finally:
            with self._cond:
                while self._closed:
                    self._cond.wait()
                seconds = time.perf_counter() - t0
                self._waited += seconds
                self._waiting -= 1
                self._cond.notify_all()
        return seconds

    def take_waited(self) -> float:
        """Seconds callers waited since the last call, once every woken waiter has counted itself.

        Called once per save by the commit thread, after :meth:`release`, so waiters are
        already awake and this returns at once; a save that deferred nothing takes 0.0.
        """
        with self._cond:
            while self._waiting and not self._closed:
                self._cond.wait()
            waited, self._waited = self._waited, 0.0
            return waited


class OptimizerFence:
    """A global ``torch.optim`` step pre-hook: learns the optimizers, waits on the fence.

    An optimizer's step is where DDP training changes parameters and optimizer state, so
    a replica check that reads them after ``save()`` returned is exact as long as no step
    runs before it is done: the hook holds every ``optimizer.step()`` (of any optimizer in
    the process) at the fence. The optimizers it has seen step are also what
    :meth:`managed` reports, so the saver defers only tensors an optimizer owns; anything
    else (buffers a forward pass updates, tensors of optimizers never seen) is still
    hashed before ``save()`` returns. Registered by ``ReferenceCheckpointer`` for async
    saves with ``replicas=verify``; :meth:`remove` by its ``close()``.
    """

    def __init__(self, fence: Fence) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.fence = fence
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handle = register_optimizer_step_pre_hook(self._pre_step)

    def _pre_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        self.optimizers.add(optimizer)
        self.fence.wait()

    def managed(self) -> dict[int, int]:
        """``data_ptr -> nbytes`` of every CPU parameter and state tensor of the optimizers seen."""
        from chaos.reference.ckptformat.dtensor import is_dtensor

        out: dict[int, int] = {}

        def note(t: Any) -> None:
            if not isinstance(t, torch.Tensor):
                return
            if is_dtensor(t):
                t = t.to_local()
            if t.device.type != "cpu":
                return
            n = t.numel() * t.element_size()
            if n:
                ptr = t.data_ptr()
                out[ptr] = max(n, out.get(ptr, 0))

        for opt in list(self.optimizers):
            for group in opt.param_groups:
                for p in group["params"]:
                    note(p)
            for st in opt.state.values():
                if isinstance(st, dict):
                    for v in st.values():
                        note(v)
        return out

    def remove(self) -> None:
        self._handle.remove()
