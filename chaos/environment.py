"""What a scenario's faults need around the ranks, set up before and torn down after.

Network namespaces for link drops, a size-limited tmpfs under the checkpoint root for
a real ENOSPC, and the supervisor-side actions (fill the disk, cut a link, corrupt a
committed checkpoint at rest, freeze the tree for power-loss exploration). Teardown
runs whatever happened; a fault that cannot be had on this machine raises
``faults.Unsupported`` up front, which the runner reports as a skipped scenario with
the reason.
"""

from __future__ import annotations

import glob
import json
import math
import os
import random
from pathlib import Path
from typing import Any

from chaos.scenario import Fault

TMPFS_BYTES = 1 << 30  # room for several checkpoints; tmpfs only uses what is written


class Environment:
    def __init__(self, faults: list[Fault], world_size: int, ckpt_root: str | None, log_dir: str,
                 save_every: int) -> None:
        self.faults, self.world_size, self.log_dir = faults, world_size, log_dir
        self.ckpt_root = os.path.realpath(ckpt_root) if ckpt_root else None
        self.save_every = save_every
        self.families = {f.family for f in faults}
        self.lab: Any = None
        self._tmpfs: Any = None
        self.disk_mechanism: str | None = None
        self.snapshots: dict[int, Any] = {}  # fault index -> Snapshot taken at the barrier
        self.trace_marks: dict[int, dict[int, int]] = {}  # fault index -> rank -> trace records so far
        self.log: list[dict[str, Any]] = []

    # -- set-up and teardown -------------------------------------------------------
    def __enter__(self) -> Environment:
        try:
            if "net" in self.families:
                from faults import Unsupported
                from faults.network import NetworkLab, can_use_netns

                ok, why = can_use_netns()
                if not ok:
                    raise Unsupported(f"network drop needs network namespaces: {why}")
                self.lab = NetworkLab(self.world_size)
                self.lab.setup()
            if "disk" in self.families and self.ckpt_root:
                os.makedirs(self.ckpt_root, exist_ok=True)
                if os.geteuid() == 0:
                    from faults.disk import mounted_tmpfs

                    self._tmpfs = mounted_tmpfs(self.ckpt_root, TMPFS_BYTES, scratch_root=self.ckpt_root)
                    self.log.append({"event": "tmpfs", **self._tmpfs.__enter__()})
                    self.disk_mechanism = "tmpfs"
                else:
                    self.disk_mechanism = "interposer"
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tmpfs is not None:
            tmpfs, self._tmpfs = self._tmpfs, None
            tmpfs.__exit__(None, None, None)
        if self.lab is not None:
            lab, self.lab = self.lab, None
            lab.teardown()

    # -- what ranks need -----------------------------------------------------------
    def rank_network(self, rank: int, port: int) -> tuple[str, str | None, dict[str, str]]:
        """(master address, netns name, environment) for a rank."""
        if self.lab is None:
            return "127.0.0.1", None, {}
        return self.lab.addr(0), self.lab.ns_name(rank), self.lab.rank_env(rank, port)

    def io_rules(self, fault: Fault) -> list[dict[str, Any]]:
        """The interposer rules that carry out an ``io`` fault (or disk-full without root)."""
        from faults.interposer import IORule

        if fault.family == "disk":
            save_step = math.ceil(fault.step / self.save_every) * self.save_every if self.save_every else None
            return [IORule("enospc", byte=int(fault.param("free", 0)), past=True, times=None, step=save_step).to_dict()]
        action = {"crash": "kill", "eio": "eio", "enospc": "enospc", "fsyncfail": "fsync_fail",
                  "shortwrite": "short_write", "slowio": "delay"}[fault.kind]
        rule = IORule(action, op=fault.param("op"), nth=int(fault.param("nth", 1)), path_glob=fault.param("path"),
                      byte=fault.param("byte"), phase=fault.param("phase"), step=fault.step,
                      delay_s=float(fault.param("delay", 0.0)), keep=fault.param("keep"),
                      times=fault.param("times", 1))
        return [rule.to_dict()]

    # -- supervisor-side actions -----------------------------------------------------
    def fill_disk(self, fault: Fault) -> dict[str, Any]:
        """Leave ``free`` bytes. A rank still writing (an async save) can take space between
        measuring and allocating: then measure again; a disk that is already fuller than
        asked is recorded as such."""
        import errno

        from faults import FaultError
        from faults.disk import free_bytes, prefill

        leave = int(fault.param("free", 0))
        for _ in range(5):
            try:
                record = prefill(self.ckpt_root, leave, scratch_root=self.ckpt_root)
                return {"mechanism": "tmpfs", **record.to_dict()}
            except FaultError:
                break  # already less free than asked
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        return {"mechanism": "tmpfs", "leave_bytes": leave, "free_after": free_bytes(self.ckpt_root),
                "note": "the disk filled up by itself while the filler was being allocated"}

    def link_down(self, rank: int) -> dict[str, Any]:
        return self.lab.link_down(rank)

    def mark_powerloss(self, index: int, trace_path: Any) -> dict[str, Any]:
        """All ranks wait at the start of the save: freeze the tree and where each trace stands."""
        from faults.crashstate import Snapshot

        self.snapshots[index] = Snapshot.capture(self.ckpt_root)
        marks = {}
        for rank in range(self.world_size):
            path = Path(trace_path(rank))
            marks[rank] = len(path.read_bytes().splitlines()) if path.exists() else 0
        self.trace_marks[index] = marks
        snap = self.snapshots[index]
        return {"files": len(snap.files), "bytes": sum(len(b) for b in snap.files.values()), "trace_marks": marks}

    def after_attempt(self, attempt: int, pending_rest: list[Fault], log_paths: list[str]) -> list[dict[str, Any]]:
        """Between attempts: corrupt what was planned, give the disk and network back."""
        done = [{"kind": f.kind, "spec": f.spec(), "attempt": attempt, **self.corrupt(f, log_paths)}
                for f in pending_rest]
        if self._tmpfs is not None:
            from faults.disk import remove_fillers

            remove_fillers(self.ckpt_root)
        if self.lab is not None:
            for rank in range(self.world_size):
                self.lab.link_up(rank)
        return done

    # -- at-rest corruption ------------------------------------------------------------
    def _last_save_window(self, log_paths: list[str]) -> float | None:
        """Start time of the newest save that returned on every rank (its files are the targets)."""
        calls: dict[int, list[float]] = {}
        returned: dict[int, int] = {}
        for path in log_paths:
            try:
                lines = Path(path).read_text().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev["ev"] == "save_call":
                    calls.setdefault(ev["step"], []).append(ev["t"])
                elif ev["ev"] == "save_return":
                    returned[ev["step"]] = returned.get(ev["step"], 0) + 1
        complete = [s for s, n in returned.items() if n == len(log_paths)]
        return min(calls[max(complete)]) if complete else None

    def corrupt(self, fault: Fault, log_paths: list[str]) -> dict[str, Any]:
        from faults import FaultError
        from faults.corrupt import apply, checkpoint_files, plan_corruption
        from faults.disk import FILLER_PREFIX

        if not self.ckpt_root or not os.path.isdir(self.ckpt_root):
            return {"changed": False, "reason": "no checkpoint root"}
        since = self._last_save_window(log_paths)
        files = [f for f in checkpoint_files(self.ckpt_root, fault.param("file"))
                 if not os.path.basename(f).startswith(FILLER_PREFIX)]
        if since is not None:
            newest = [f for f in files if os.stat(f).st_mtime >= since - 0.01]
            files = newest or files
        if not files:
            return {"changed": False, "reason": "no checkpoint file to corrupt"}
        seed = int(fault.param("seed", 0))
        target = random.Random(f"{seed}:{fault.kind}:target").choice(files)
        ckpt_dir = os.path.dirname(target)
        older = None
        if fault.kind == "stale":
            parent = os.path.dirname(ckpt_dir)
            siblings = sorted((d for d in glob.glob(os.path.join(glob.escape(parent), "*"))
                               if os.path.isdir(d) and d != ckpt_dir), key=os.path.getmtime)
            if ckpt_dir == self.ckpt_root or not siblings:
                return {"changed": False, "reason": "no older checkpoint directory to take a stale copy from"}
            older = siblings[-1]
        try:
            plan = plan_corruption(
                ckpt_dir, fault.kind, seed, scratch_root=self.ckpt_root,
                pattern=glob.escape(os.path.basename(target)), region=fault.param("region", "any"),
                n_bits=int(fault.param("bits", 1)), fraction=fault.param("fraction"),
                zero_len=int(fault.param("length", 64)), older_dir=older)
            record = apply(plan).to_dict()
        except FaultError as exc:
            return {"changed": False, "reason": str(exc), "target": os.path.relpath(target, self.ckpt_root)}
        record["target"] = os.path.relpath(target, self.ckpt_root)
        return record
