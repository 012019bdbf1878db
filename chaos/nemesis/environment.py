"""What a scenario's faults need around the ranks, set up before and torn down after.

Network namespaces for link drops, a size-limited tmpfs under the checkpoint root for
a real ENOSPC, and the supervisor-side actions (fill the disk, cut a link, corrupt a
committed checkpoint at rest (files, or the objects of an ``s3://`` store), plant
payloads and check their markers, freeze the tree for power-loss exploration). Teardown
runs whatever happened; a fault that cannot be had on this machine raises
``faults.Unsupported`` up front, which the runner reports as a skipped scenario with
the reason.

An at-rest fault lands in a file the loader really reads: before the first one, the
environment traces one fault-free load of the checkpoint it is about to attack, with
the launch plan ``chaos.launch.cluster.run`` hands it (``bind``), and picks from what that
load opened, the first file read first (``chaos.plan.loadtrace``). The fault's record says
how the target was chosen (``choice``).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaos.model.fault import Fault
from chaos.nemesis import newest

TMPFS_BYTES = 1 << 30  # room for several checkpoints; tmpfs only uses what is written


class Environment:
    def __init__(self, faults: list[Fault], world_size: int, ckpt_root: str | None, log_dir: str,
                 save_every: int, storage: str | None = None) -> None:
        self.faults, self.world_size, self.log_dir = faults, world_size, log_dir
        self.ckpt_root = os.path.realpath(ckpt_root) if ckpt_root else None
        self.storage = storage  # the checkpointer's storage URL (ckpt option), None: files under ckpt_root
        self.scratch = os.path.dirname(os.path.realpath(log_dir))  # the scenario's scratch root
        self.planted: list[dict[str, Any]] = []  # payload records whose markers are checked
        self.save_every = save_every
        self.families = {f.family for f in faults}
        self.lab: Any = None
        self._tmpfs: Any = None
        self.disk_mechanism: str | None = None
        self.snapshots: dict[int, Any] = {}  # fault index -> Snapshot taken at the barrier
        self.trace_marks: dict[int, dict[int, int]] = {}  # fault index -> rank -> trace records so far
        self.log: list[dict[str, Any]] = []
        # (root, scratch, storage scheme) -> chaos.plan.loadtrace.LoadTrace: a fault-free load of
        # the plan being run, traced; handed over by the launcher once bound
        self.load_tracer: Callable[[str, str, str | None], Any] | None = None
        self._load_trace: Any = None  # chaos.plan.loadtrace.LoadTrace of this scenario, once traced

    def bind(self, load_tracer: Callable[[str, str, str | None], Any]) -> None:
        """Called by ``chaos.launch.cluster.run`` with a tracer of a fault-free load by the plan it runs
        (its checkpointer, options, workload, world size: ``chaos.plan.loadtrace.trace_load``
        bound to that plan and the launcher's own ``verify``). An environment never bound
        (another driver) picks at-rest targets as before, and says so."""
        self.load_tracer = load_tracer

    # -- set-up and teardown -------------------------------------------------------
    def __enter__(self) -> Environment:
        try:
            if "net" in self.families:
                from faults import Unsupported
                from faults.network import NetworkLab, can_use_netns

                ok, why = can_use_netns()
                if not ok:
                    raise Unsupported(f"network drop needs network namespaces: {why}")
                from chaos.scratch import claim_netns

                self.lab = NetworkLab(self.world_size)
                claim_netns(self.lab.suffix)  # swept by the next harness if this one is killed
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
        if self.planted:
            self.check_markers("verification")  # the last loads: verification and teardown
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
        return [fault.io_rule()]

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
        """Between attempts: see whether planted payloads ran, corrupt what was planned, give
        the disk and network back."""
        if self.planted:
            self.check_markers(f"attempt {attempt}")
        # A shallow copy: a payload's nested ``marker`` dict stays the one check_markers updates.
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
    @staticmethod
    def _events(log_paths: list[str]) -> Iterator[dict[str, Any]]:
        """Every event of these rank logs, in order; a missing log or a torn line is skipped."""
        for path in log_paths:
            try:
                lines = Path(path).read_text().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    def _auxiliary_globs(self, log_paths: list[str]) -> list[str]:
        """The ``auxiliary_files`` globs the checkpointer declared (its ``ckpt_ready`` event)."""
        globs: list[str] = []
        for ev in self._events(log_paths):
            if ev.get("ev") == "ckpt_ready":
                globs += [g for g in ev.get("auxiliary") or () if g not in globs]
        return globs

    def _last_save_window(self, log_paths: list[str]) -> float | None:
        """Start time of the newest save that returned on every rank (its files are the targets)."""
        calls: dict[int, list[float]] = {}
        returned: dict[int, int] = {}
        for ev in self._events(log_paths):
            if ev["ev"] == "save_call":
                calls.setdefault(ev["step"], []).append(ev["t"])
            elif ev["ev"] == "save_return":
                returned[ev["step"]] = returned.get(ev["step"], 0) + 1
        complete = [s for s, n in returned.items() if n == len(log_paths)]
        return min(calls[max(complete)]) if complete else None

    def corrupt(self, fault: Fault, log_paths: list[str]) -> dict[str, Any]:
        """Corrupt (or, for ``payload``, plant in) one file of the newest checkpoint.

        The result always says ``changed``; when it is False the fault did nothing and
        ``idle`` says why (``no target``: nothing matched; ``same bytes``: the edit was a
        no-op) with a one-line ``reason``, which :func:`idle_faults` turns into a
        skipped scenario. ``offsets`` lists where bytes changed.
        """
        scheme = self._storage_scheme()
        if scheme == "s3":
            return self._corrupt_s3(fault)
        if scheme not in ("file", None):
            return _idle("no target", f"at-rest corruption of {scheme}:// storage is not supported "
                                      f"({self.storage}); only file:// and s3:// are")
        root = self._local_root()
        if not root or not os.path.isdir(root):
            return _idle("no target", f"no checkpoint root {root!r} exists (the job never saved?)")
        return self._corrupt_tree(fault, root, self._newest_files(fault, root, log_paths), traced=True)

    def _traced_load(self, root: str) -> tuple[Any, str | None]:
        """The fault-free load's reads of the tree at ``root`` (traced once per scenario), or why there are none."""
        if self.load_tracer is None:
            return None, "the launch plan was not handed to the environment (a driver that runs its own attempts)"
        if self._load_trace is None:
            self._load_trace = self.load_tracer(root, self.scratch, self._storage_scheme())
        return self._load_trace, None

    def _storage_scheme(self) -> str | None:
        if not self.storage:
            return None
        from chaos.reference.storage.base import parse_url

        return parse_url(self.storage).scheme

    def _local_root(self) -> str | None:
        if self.storage:
            from chaos.reference.storage.base import parse_url

            return os.path.realpath(parse_url(self.storage).location)
        return self.ckpt_root

    def _newest_files(self, fault: Fault, root: str, log_paths: list[str]) -> list[str] | str:
        """Files of the newest checkpoint matching ``file=``; a string says why there are none."""
        from faults.corrupt import checkpoint_files
        from faults.disk import FILLER_PREFIX

        pattern = fault.param("file")
        files = [f for f in checkpoint_files(root, pattern) if not os.path.basename(f).startswith(FILLER_PREFIX)]
        if pattern is None:  # not the files the checkpointer declared auxiliary (metrics): no load reads them
            aux = self._auxiliary_globs(log_paths)
            files = [f for f in files if not any(fnmatch.fnmatchcase(os.path.relpath(f, root), g) for g in aux)]
        if not files:
            return f"no file under the checkpoint root matches file={pattern!r}"
        since = self._last_save_window(log_paths)
        if since is None:
            return files
        newest = [f for f in files if os.stat(f).st_mtime >= since - 0.01]
        if not newest:
            return (f"no file of the newest checkpoint matches file={pattern!r} ({len(files)} older file(s) do, "
                    f"e.g. {os.path.relpath(files[0], root)})")
        return newest

    def _corrupt_tree(self, fault: Fault, root: str, files: list[str] | str,
                      older_of: Any = None, traced: bool = False) -> dict[str, Any]:
        """Carry out ``fault`` on one of ``files`` (all under ``root``).

        ``traced``: choose among the files a traced fault-free load of ``root`` read, the
        first one read first (``chaos.plan.loadtrace.choose``); otherwise (an object store's
        mirror) seeded among ``files`` as before. The record's ``choice`` says which and why.
        """
        from chaos.plan.loadtrace import choose
        from faults import FaultError
        from faults.corrupt import why_unchanged

        if isinstance(files, str):
            return _idle("no target", files)
        seed = int(fault.param("seed", 0))
        if fault.kind in ("bitflip", "zero"):  # never draw a file the edit cannot change (a `latest` pointer)
            from faults.corrupt import corruptible

            able = corruptible(files, fault.kind, region=fault.param("region", "any"), offset=fault.param("offset"),
                               at=fault.param("at"))
            if not able:
                return _idle("no target", f"no file of the newest checkpoint has a non-empty "
                                          f"{fault.param('region', 'any')} region")
            files = able
        if fault.kind == "stale":  # nor one without an older copy (a `latest` pointer in the root): first read
            older_copy = older_of or self._older_sibling  # would otherwise always be the pointer, and idle

            def has_older(f: str) -> bool:
                older = older_copy(f, root)
                return older is not None and os.path.isfile(os.path.join(older, os.path.basename(f)))

            files = [f for f in files if has_older(f)] or files
        if traced:
            trace, why = self._traced_load(root)
        else:
            trace, why = None, "the checkpoint lives in an object store, whose reads no trace sees"
        target, choice = choose(fault, root, files, trace, why)
        rel = os.path.relpath(target, root)
        if fault.kind == "payload":
            return self._plant(fault, root, target, seed, choice)
        ckpt_dir = os.path.dirname(target)
        older = None
        if fault.kind == "stale":
            older = (older_of or self._older_sibling)(target, root)
            if older is None:
                return _idle("no target", "no older checkpoint directory to take a stale copy from", target=rel,
                             choice=choice)
        try:
            rec = newest.edit(fault, ckpt_dir, target, root, older)
        except FaultError as exc:
            return _idle("no target", str(exc), target=rel, choice=choice)
        record = rec.to_dict()
        record.update(target=rel, offsets=[c["start"] for c in rec.changes], choice=choice)
        if not rec.changed:
            record.update(idle="same bytes", reason=f"{rel}: {why_unchanged(rec)}")
        return record

    @staticmethod
    def _older_sibling(target: str, root: str) -> str | None:
        ckpt_dir = os.path.dirname(target)
        parent = os.path.dirname(ckpt_dir)
        siblings = sorted((d for d in glob.glob(os.path.join(glob.escape(parent), "*"))
                           if os.path.isdir(d) and d != ckpt_dir), key=os.path.getmtime)
        return None if ckpt_dir == root or not siblings else siblings[-1]

    # -- payloads: loading must never execute code from the checkpoint -------------------
    def _plant(self, fault: Fault, root: str, target: str, seed: int,
               choice: dict[str, Any] | None = None) -> dict[str, Any]:
        """Plant the payload; its marker is checked after every later attempt (``check_markers``)."""
        import uuid

        from faults import FaultError
        from faults.payload import plant

        marker_dir = os.path.join(self.scratch, "payload-markers")
        os.makedirs(marker_dir, exist_ok=True)
        marker = os.path.join(marker_dir, f"{len(self.planted)}-{uuid.uuid4().hex[:8]}")
        rel = os.path.relpath(target, root)
        try:
            rec = plant(target, str(fault.param("format", "pickle")), marker, seed=seed,
                        scratch_root=root, marker_root=self.scratch, variant=fault.param("variant"))
        except FaultError as exc:
            return _idle("no target", str(exc), target=rel, choice=choice)
        record = rec.to_dict()
        record.update(target=rel, offsets=[c["start"] for c in rec.changes], choice=choice,
                      marker={"path": marker, "exists": False, "checks": [], "first_seen": None})
        if not rec.changed:
            record.update(idle="same bytes", reason=f"{rel}: the payload is byte for byte what was there")
        self.planted.append(record)
        return record

    def check_markers(self, when: str) -> None:
        """Whether each planted payload has run so far: written into its (already handed
        over) fired-fault record, which is the same dict object the cluster stored."""
        for record in self.planted:
            m = record["marker"]
            exists = os.path.exists(m["path"])
            m["checks"].append({"after": when, "exists": exists})
            if exists and not m["exists"]:
                m["first_seen"] = when
            m["exists"] = m["exists"] or exists

    # -- object stores ---------------------------------------------------------------
    def _corrupt_s3(self, fault: Fault) -> dict[str, Any]:
        """The objects of the newest committed checkpoint, corrupted with the same seeded functions.

        They are read into a mirror under the scenario's scratch root (keys as relative
        paths: ``data/step-N-<nonce>/...``, ``commits/step-N.json``, ``latest``), the
        fault acts on the mirror exactly as on a POSIX tree, and every object whose bytes
        changed is put back (a deleted file deletes its object).
        """
        import shutil
        import uuid

        from chaos.reference.storage.base import parse_url
        from chaos.reference.storage.s3 import COMMIT_KEY, make_client

        u = parse_url(self.storage)
        client, bucket, prefix = make_client(u), u.location, u.prefix
        keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for o in page.get("Contents", [])]
        commits = sorted((int(m.group(1)), k) for k in keys if (m := COMMIT_KEY.match(k[len(prefix):])))
        if not commits:
            return _idle("no target", f"no committed checkpoint under s3://{bucket}/{prefix}")

        def data_of(commit_key: str) -> str | None:
            """The data prefix a commit object names (None: it is damaged, e.g. by an earlier fault)."""
            try:
                data = json.loads(client.get_object(Bucket=bucket, Key=commit_key)["Body"].read())["data"]
            except (ValueError, KeyError, TypeError):
                return None
            return prefix + data if isinstance(data, str) and data.endswith("/") else None

        step, newest_commit = commits[-1]
        new_data = data_of(newest_commit)
        old_data = data_of(commits[-2][1]) if len(commits) > 1 else None
        newest = [newest_commit] + [k for k in keys if new_data and k.startswith(new_data)]
        newest += [k for k in keys if k == prefix + "latest"]
        older = [k for k in keys if old_data and k.startswith(old_data)]
        mirror = os.path.join(self.scratch, f"s3-rest-{uuid.uuid4().hex[:8]}")
        original: dict[str, bytes] = {}
        try:
            for key in older + newest:
                path = os.path.join(mirror, key[len(prefix):])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                original[key] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
                with open(path, "wb") as f:
                    f.write(original[key])
            import fnmatch

            pattern = fault.param("file")
            files = [os.path.join(mirror, k[len(prefix):]) for k in newest
                     if pattern is None or fnmatch.fnmatchcase(k[len(prefix):], pattern)
                     or fnmatch.fnmatchcase(k.rsplit("/", 1)[-1], pattern)]
            if not files:
                return _idle("no target", f"no object of the newest checkpoint (step {step}) under "
                                          f"s3://{bucket}/{prefix} matches file={pattern!r}")
            older_dir = os.path.join(mirror, old_data[len(prefix):]) if older and old_data else None

            def older_of(target: str, root: str) -> str | None:  # shards and manifests have older copies
                return older_dir if older_dir and os.path.relpath(target, root).startswith("data" + os.sep) else None

            record = self._corrupt_tree(fault, mirror, files, older_of)
            written, deleted = [], []
            for key in newest:
                path = os.path.join(mirror, key[len(prefix):])
                if not os.path.exists(path):
                    client.delete_object(Bucket=bucket, Key=key)
                    deleted.append(key)
                    continue
                with open(path, "rb") as f:
                    now = f.read()
                if now != original[key]:
                    client.put_object(Bucket=bucket, Key=key, Body=now)
                    written.append(key)
            record.update(store=f"s3://{bucket}/{prefix}", step=step, objects_written=written,
                          objects_deleted=deleted)
            if "target" in record:
                record["target_object"] = f"s3://{bucket}/{prefix}{record['target']}"
            for key in ("path",):  # the mirror is gone after this: name the object instead
                if key in record:
                    record[key] = record.get("target_object", record[key])
            return record
        finally:
            shutil.rmtree(mirror, ignore_errors=True)


def _idle(why: str, reason: str, **extra: Any) -> dict[str, Any]:
    """The record of a fault that did nothing: ``idle`` is ``no target`` or ``same bytes``."""
    return {"changed": False, "idle": why, "reason": reason, **extra}


def idle_faults(fired: Any) -> str | None:
    """Why the scenario tested nothing: an at-rest fault fired but changed nothing.

    The runner calls this beside ``_unfired_faults`` with ``outcome.fired()`` (objects
    or dicts with a ``detail``); a corruption that matched no file, or whose edit left
    every byte as it was, makes a green run *skipped* with this reason.
    """
    for f in fired:
        detail = f.get("detail", {}) if isinstance(f, dict) else f.detail
        c = (detail or {}).get("corruption")
        if c is not None and not c.get("changed", False):
            spec = f.get("spec") if isinstance(f, dict) else f.spec
            return (f"skipped: fault {spec} did nothing ({c.get('idle', 'no change')}): "
                    f"{c.get('reason', 'no byte changed')}; the run passed but tested nothing")
    return None
