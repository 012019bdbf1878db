"""Async save: a full snapshot into reusable staging buffers, then a background commit.

``save()`` copies every tensor into a CPU staging buffer (pinned when the source is on
CUDA, so the copy is a fast DMA) before it returns, so the caller may update live
tensors at once. Buffers are reused across saves when shapes and dtypes match, so a
steady-state save allocates nothing. One save at a time is in flight: the next
``save()`` first joins the previous one; a background failure is kept and raised by
the next ``save()`` or ``wait()``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping

import torch


class Staging:
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
            buf.copy_(t, non_blocking=t.is_cuda)
            out[path] = buf
        if cuda:
            torch.cuda.synchronize()
        self.buffers = out
        return out


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
