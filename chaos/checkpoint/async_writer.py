"""Async save: a full snapshot into reusable staging buffers, then a background commit.

``save()`` copies every tensor into a CPU staging buffer (pinned when the source is on
CUDA, so the copy is a fast DMA) before it returns, so the caller may update live
tensors at once. Buffers are reused across saves when shapes and dtypes match, so a
steady-state save allocates nothing. One save at a time is in flight: the next
``save()`` first joins the previous one; a background failure is kept and raised by
the next ``save()`` or ``wait()``.
"""

from __future__ import annotations

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
    """Runs one job at a time on a daemon thread and keeps its exception."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self.join()

        def run() -> None:
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self.error = exc

        self.thread = threading.Thread(target=run, name="chaos-ckpt-commit", daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def take_error(self) -> BaseException | None:
        err, self.error = self.error, None
        return err
