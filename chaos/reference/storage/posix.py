"""POSIX backend: today's commit protocol, through the functions of ``commit.py`` unchanged.

Why a thin wrapper and not a reimplementation: the file path must stay exactly as fast
and crash-safe as before (temp directory, fsync of each shard, manifest, fsyncs, atomic
rename, fsync of the parent, atomic ``latest`` replace). Every call below is the same
Python-level ``open``/``os.fsync``/``os.rename`` the in-rank interposer traces, so crash
points, power-loss exploration and at-rest corruption keep working on this backend.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, BinaryIO

from chaos.reference.ckptformat import commit, manifest
from chaos.reference.ckptformat.shard import LoadedShard, read_shard
from chaos.reference.storage.base import restore_latest


class PosixStorage:
    """A directory on any POSIX mount (ext4, xfs, tmpfs, NFS, Lustre) every rank sees."""

    kind = "posix"
    exclusive_commit = False  # does the commit point refuse a second writer?
    commit_protocol = (
        "shards into .tmp-step-N-<nonce>/, fsync each, vote, manifest + fsync, atomic rename to "
        "step-N, fsync it, latest replaced by temp+fsync+rename, then one fsync of the parent"
    )

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root

    def create_shard(self, tmp_name: str, name: str) -> BinaryIO:
        tmp_dir = os.path.join(self.root, tmp_name)
        os.makedirs(tmp_dir, exist_ok=True)
        return open(os.path.join(tmp_dir, name), "wb")

    def durable(self, f: Any) -> None:
        f.flush()
        os.fsync(f.fileno())

    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        commit.publish(self.root, tmp_name, step, manifest_bytes)

    def read_latest(self) -> int | None:
        return commit.read_latest(self.root)

    def set_latest(self, step: int) -> None:
        """Point ``latest`` at ``step`` (temp file, fsync, atomic replace)."""
        commit.update_latest(self.root, step)

    def roll_back(self, step: int, tmp_name: str, previous: int | None) -> None:
        """After a failed publish: undo a rename that happened, restore ``latest``, drop temps."""
        root, tmp_dir = self.root, os.path.join(self.root, tmp_name)
        try:
            renamed = not os.path.isdir(tmp_dir) and os.path.isdir(os.path.join(root, commit.step_dirname(step)))
            if renamed:
                commit.unpublish(root, step)
                restore_latest(self, step, previous)
            commit.clean_stale(root)
        except OSError:
            pass

    def clean_stale(self) -> list[str]:
        return commit.clean_stale(self.root)

    def list_steps(self) -> list[int]:
        return commit.list_steps(self.root)

    def step_location(self, step: int) -> str:
        return os.path.join(self.root, commit.step_dirname(step))

    def read_manifest(self, step: int, max_bytes: int) -> tuple[dict[str, Any], str]:
        directory = self.step_location(step)
        m = manifest.read_manifest(directory, expect_step=step, max_bytes=max_bytes)
        return m, os.path.join(directory, manifest.MANIFEST_NAME)

    def read_shard(self, step: int, name: str, spec: Any, algorithm: str, verify: bool, targets: Any = None) -> LoadedShard:
        """The verified shard; opened below ``self.root`` without following a link (step directory included)."""
        extra = (targets,) if targets is not None else ()  # in-place targets, when the loader has any
        return read_shard(os.path.join(self.step_location(step), name), spec, algorithm, verify, step, *extra, root=self.root)

    def hide_step(self, step: int) -> Any:
        """Make a checkpoint invisible now (atomic rename); return the slow removal to run later."""
        hidden = commit.hide_dir(self.root, commit.step_dirname(step))
        return lambda: shutil.rmtree(hidden, ignore_errors=True)

    def close(self) -> None:
        pass
