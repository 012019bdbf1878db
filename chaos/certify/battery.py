"""The conformance battery: each storage property a checkpoint relies on, with evidence.

Why these properties: a checkpoint is only as safe as the weakest storage guarantee its
commit protocol leans on. Each check drives the *real* reference checkpointer (one
rank, ``storage=`` the backend under test, optionally wrapped) or the backend's own
operations, against real files or a real S3 endpoint, and returns ``pass``, ``fail`` or
``n/a`` with the reason — never a guess. Readers are always fresh instances (a new
checkpointer, a new boto3 client, a new fsspec filesystem instance with no listing
cache: see ``chaos.reference.storage.fsspec_store.FRESH``), so a backend cannot pass by this
process remembering what it wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from chaos.certify.crash import run_crashing
from chaos.certify.harness import (
    Bench,
    error_text,
    expect_only,
    fingerprint,
    make_state,
    reset_to_one,
)
from chaos.certify.target import Target
from chaos.model.check import Check
from chaos.reference.storage.base import parse_url


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    t = time.perf_counter()
    try:
        v = fn()
    except Exception as exc:  # noqa: BLE001 - a property that cannot even run is a failure with its error
        v = Check(name, "fail", f"the check itself failed: {error_text(exc, 300)}",
                    {"traceback": traceback.format_exc()[-2000:]})
    v.seconds = time.perf_counter() - t
    return v


# -- properties ---------------------------------------------------------------------------

def read_after_write(b: Bench) -> Check:
    """Each acknowledged save is immediately listed, pointed at by latest, and loads bit-exact in a fresh reader."""
    sub = "raw"
    w = b.ckpt(sub)
    bad: list[str] = []
    try:
        for i in (1, 2, 3):
            st = make_state(i, b.small, b.seed)
            w.save(i, st)
            r = b.reader(sub)
            try:
                steps = r.store.list_steps()
                latest = r.store.read_latest()
                if i not in steps:
                    bad.append(f"list-after-write: step {i} acknowledged but a fresh reader lists {steps}")
                if latest != i:
                    bad.append(f"latest after the save of step {i} reads {latest}")
                got = r.load_latest(make_state(0, b.small, b.seed))
                if got is None or got[0] != i or fingerprint(got[1]) != fingerprint(st):
                    bad.append(f"read-after-write: a fresh reader loaded {None if got is None else got[0]} "
                               f"{'(different bytes)' if got and got[0] == i else ''} right after step {i} was acknowledged")
            except Exception as exc:  # noqa: BLE001
                bad.append(f"read-after-write: fresh reader failed right after step {i}: {error_text(exc, 300)}")
            finally:
                r.close()
    finally:
        w.close()
    if bad:
        return Check("read_after_write", "fail", bad[0], {"violations": bad})
    return Check("read_after_write", "pass", "3 acknowledged saves each listed, latest, and bit-exact in a fresh reader at once")


def checksums_round_trip(b: Bench) -> Check:
    """Every byte written comes back: per-tensor SHA-256 equal after a verified load of a multipart-size shard."""
    sub = "checksum"
    st = make_state(7, b.large, b.seed)
    b.save_once(sub, 7, st)
    r = b.reader(sub)
    try:
        got = r.load_latest(make_state(0, b.large, b.seed))
        m, _ = r.store.read_manifest(7, 1 << 30)
    finally:
        r.close()
    if got is None or fingerprint(got[1]) != fingerprint(st):
        return Check("checksums_round_trip", "fail", "loaded state differs from the saved one", {"loaded": None if got is None else got[0]})
    shards = {n: s["checksum"] for n, s in m["shards"].items()}
    return Check("checksums_round_trip", "pass",
                   f"{b.large >> 20} MiB shard (multipart on S3) verified: shard checksums and per-tensor SHA-256 equal",
                   {"shard_checksums": shards})


def commit_atomicity(b: Bench, max_points: int = 40) -> Check:
    """Kill the saving process before each mutating operation in turn: every committed step is complete."""
    sub = "atomic"
    size = 6 << 20 if b.target.kind == "s3" else b.large  # two parts on S3: multipart points, fewer slow uploads
    base = make_state(1, size, b.seed)
    b.save_once(sub, 1, base)
    nxt = make_state(2, size, b.seed)

    def save_two() -> None:
        b.ckpt(sub).save(2, nxt)  # no close(): nothing after the acknowledgement may matter

    outcome, ops = run_crashing(save_two, None)
    # The counting run committed step 2: remove it again so each crash starts from step 1 only.
    reset_to_one(b, sub)
    if outcome != "completed" or len(ops) < 3:
        return Check("commit_atomicity", "fail", f"could not enumerate the save's operations (outcome {outcome}, {len(ops)} ops seen)",
                       {"ops": ops[:50]})
    n = len(ops)
    points = list(range(1, n + 1)) if n <= max_points else sorted({1 + round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})
    bad: list[str] = []
    tried = []
    for p in points:
        result, _ = run_crashing(save_two, p)
        tried.append({"point": p, "op": ops[p - 1], "outcome": result})
        bad += [f"crash before op {p} ({ops[p - 1]}): {v}" for v in expect_only(b, sub, {1: base, 2: nxt}, "after crash")]
        # Restore the starting point (only step 1 committed) for the next crash point.
        reset_to_one(b, sub)
        if len(bad) > 20:
            break
    ev = {"ops": n, "points": len(points), "tried": tried[:60], "violations": bad[:20]}
    if bad:
        return Check("commit_atomicity", "fail", bad[0], ev)
    return Check("commit_atomicity", "pass",
                   f"{len(points)} crash points over {n} mutating operations: every committed step complete, latest always committed", ev)


def _one_committed_then_count_shard_writes(b: Bench, sub: str) -> tuple[Any, Callable[[], None], list[str], str, list[int]]:
    """Commit step 1, then run a full save of step 2 once to count its operations.

    Returns step 1's state, the step-2 saver (to rerun crashing at a chosen op), the ops,
    the marker of a shard write on this backend and the indices of those writes; the
    backend is back to "only step 1 committed and latest".
    """
    base = make_state(1, b.small, b.seed)
    b.save_once(sub, 1, base)
    big = make_state(2, b.large, b.seed)

    def save_two() -> None:
        b.ckpt(sub).save(2, big)

    _, ops = run_crashing(save_two, None)
    reset_to_one(b, sub)
    marker = "UploadPart" if b.target.kind == "s3" else "write shard"
    return base, save_two, ops, marker, [i for i, op in enumerate(ops) if op.startswith(marker)]


def partial_invisible(b: Bench) -> Check:
    """A shard upload stopped midway (uncompleted multipart / half-written temp file) is never visible."""
    sub = "partial"
    base, save_two, ops, marker, idx = _one_committed_then_count_shard_writes(b, sub)
    if len(idx) < 2:
        return Check("partial_invisible", "fail", f"the shard was not written in parts ({len(idx)} '{marker}' ops): cannot stop it midway",
                       {"ops": ops[:40]})
    point = idx[len(idx) // 2] + 1
    outcome, _ = run_crashing(save_two, point)
    evidence: dict[str, Any] = {"stopped_before": ops[point - 1], "outcome": outcome}
    bad = expect_only(b, sub, {1: base}, "after a stopped upload")
    r = b.reader(sub)
    try:
        if b.target.kind == "s3":
            st = r.store
            ups = st.uncompleted_uploads()
            evidence["uncompleted_uploads"] = ups
            for key in ups:
                try:
                    st.client.head_object(Bucket=st.bucket, Key=key)
                    bad.append(f"the uncompleted multipart object {key} is readable")
                except Exception:  # noqa: BLE001 - 404 is the expected answer
                    pass
        got = r.load_latest(make_state(0, b.small, b.seed))
        if got is None or got[0] != 1:
            bad.append(f"load_latest after the stopped upload returned {None if got is None else got[0]}, expected step 1")
    finally:
        r.close()
    if bad:
        return Check("partial_invisible", "fail", bad[0], evidence | {"violations": bad})
    return Check("partial_invisible", "pass", f"upload stopped before {ops[point - 1]}: not listed, not loadable, step 1 still latest", evidence)


def concurrent_writers(b: Bench) -> Check:
    """Two writers publish the same step at the same moment: exactly one may be acknowledged."""
    from chaos import phases

    sub = "concurrent"
    states = {k: make_state(10 + k, b.small, b.seed) for k in (0, 1)}
    barrier = threading.Barrier(2, timeout=20)
    commit_phase = {"commit", "rename"}

    def listener(name: str, info: dict[str, Any]) -> None:
        if name in commit_phase and threading.current_thread().name.startswith("writer-"):
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

    results: dict[int, str] = {}
    ckpts = {k: b.ckpt(sub) for k in (0, 1)}

    def run(k: int) -> None:
        try:
            ckpts[k].save(5, states[k])
            results[k] = "acknowledged"
        except Exception as exc:  # noqa: BLE001
            results[k] = f"rejected: {error_text(exc, 200)}"

    phases.subscribe(listener)
    try:
        threads = [threading.Thread(target=run, args=(k,), name=f"writer-{k}") for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        phases.unsubscribe(listener)
        for c in ckpts.values():
            c.close()
    acked = [k for k, v in results.items() if v == "acknowledged"]
    r = b.reader(sub)
    try:
        got = r.load_latest(make_state(0, b.small, b.seed))
    finally:
        r.close()
    holder = next((k for k in (0, 1) if got and fingerprint(got[1]) == fingerprint(states[k])), None)
    ev = {"writers": {str(k): v for k, v in results.items()}, "committed_state_of_writer": holder}
    if not acked and got is None:
        # Nothing was promised and nothing is there: safe, but the race this property is about never
        # produced a winner, so there is nothing to judge (it once read "fail" on a tmpfs).
        return Check("concurrent_writers", "not_judged", "both writers were refused and nothing was committed: "
                     f"no winner to judge (writer 0: {results.get(0, '?')[:100]}; writer 1: "
                     f"{results.get(1, '?')[:100]})", ev)
    if got is None or holder is None:
        return Check("concurrent_writers", "fail", "after two concurrent commits the step holds neither writer's complete state", ev)
    exclusive = getattr(r.store, "exclusive_commit", False)
    if exclusive and len(acked) == 1 and acked[0] == holder:
        return Check("concurrent_writers", "pass", f"exactly one writer acknowledged (writer {holder}); the other was told: {results[1 - holder][:120]}", ev)
    if not exclusive and len(acked) >= 1 and holder in acked:
        # Not exclusive by design: whichever way this race went, another timing could let
        # both through, so this run cannot earn a pass; it can still show no mixture.
        why = ("POSIX rename has no exclusive create for directories: a second publish of a step replaces it"
               if r.store.kind == "posix" else f"the {r.store.kind} commit is check-then-put, not an exclusive create")
        return Check("concurrent_writers", "not_judged",
                       f"{why} (the reference's re-save semantics, one publisher per root by design); checked: "
                       f"{len(acked)} acknowledged, the result is one writer's complete state (writer {holder}), never a mixture", ev)
    return Check("concurrent_writers", "fail",
                   f"{len(acked)} writers acknowledged a commit of the same step; the stored state is writer {holder}'s", ev)


def dropped_connection(b: Bench, seed: int = 0) -> Check:
    """The connection to the store is reset (or blackholed) mid-upload: the save fails and nothing commits."""
    if b.target.kind != "s3":
        return Check("dropped_connection", "not_judged", "no network between the checkpointer and a local file system; "
                       "a process dying mid-write is covered by commit_atomicity")
    import random

    from faults.tcpproxy import FaultProxy, ProxyRule

    rng = random.Random(seed)
    sub = "dropped"
    base = make_state(1, b.small, b.seed)
    b.save_once(sub, 1, base)
    host, port = b.target.endpoint_hostport()
    cases = [ProxyRule("reset", after_bytes=rng.randrange(1000, 3 << 20), once=False),
             ProxyRule("reset", after_bytes=rng.randrange(6 << 20, 11 << 20), once=False),
             ProxyRule("blackhole", after_bytes=rng.randrange(1 << 20, 4 << 20), once=False)]
    bad: list[str] = []
    log: list[dict[str, Any]] = []
    allowed: dict[int, Any] = {1: base}
    for i, rule in enumerate(cases):
        big = make_state(2 + i, b.large, b.seed)
        with FaultProxy((host, port), seed=seed) as proxy:
            c = b.ckpt(sub, endpoint=proxy.endpoint, url_params={"read_timeout": 2, "connect_timeout": 2, "retries": 2})
            proxy.set_rules([rule])
            try:
                c.save(2 + i, big)
                # Acknowledged after the client's retries: allowed only if what committed is exact.
                allowed[2 + i] = big
                log.append({"rule": rule.__dict__, "save": "acknowledged (the client retried on a new connection)"})
            except Exception as exc:  # noqa: BLE001 - the expected outcome
                log.append({"rule": rule.__dict__, "save": f"failed: {error_text(exc, 160)}"})
            finally:
                proxy.set_rules([])
                with contextlib.suppress(Exception):
                    c.close()
            log[-1:] and log[-1].setdefault("fired", [e for e in proxy.log if e["action"] in ("reset", "blackhole")][:3])
        bad += expect_only(b, sub, allowed, f"after {rule.kind} at byte {rule.after_bytes}")
    failed = sum(1 for e in log if e["save"].startswith("failed"))
    if bad:
        return Check("dropped_connection", "fail", bad[0], {"cases": log, "violations": bad})
    if not failed:
        return Check("dropped_connection", "fail", "no injected drop made a save fail: the faults did not bite", {"cases": log})
    return Check("dropped_connection", "pass",
                   f"{len(cases)} drops mid-upload (2 resets, 1 blackhole): {failed} save(s) failed with nothing committed, "
                   f"{len(cases) - failed} healed by client retries and load bit-exact", {"cases": log, "seed": seed})


def full_disk(b: Bench) -> Check:
    """Out of space mid-save: the save raises, is not acknowledged, nothing partial is committed."""
    if b.target.kind == "fsspec":
        return Check("full_disk", "not_judged", "a generic fsspec filesystem offers no quota the harness can fill safely: not tested")
    if b.target.kind == "s3":
        return Check("full_disk", "not_judged", "the store has no quota to exhaust here (moto has none; a real endpoint's "
                       "quota cannot be provoked safely): not tested. Store errors are exercised by dropped_connection")
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return Check("full_disk", "not_judged", "needs root to mount a size-limited tmpfs on the target for a real ENOSPC")
    run_dir = os.path.dirname(b.target.url("x")[len("file://"):])
    os.makedirs(run_dir, exist_ok=True)
    mnt = tempfile.mkdtemp(prefix="quota-", dir=run_dir)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mnt], check=True, capture_output=True, timeout=20)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(mnt, ignore_errors=True)
        return Check("full_disk", "not_judged", f"could not mount a tmpfs on the target: {exc}")
    try:
        sub = os.path.basename(mnt) + "/ck"
        base = make_state(1, 1 << 18, b.seed)
        w = b.ckpt(sub)
        try:
            w.save(1, base)
            try:
                w.save(2, make_state(2, 8 << 20, b.seed))
                return Check("full_disk", "fail", "an 8 MiB save into 3 MiB of free space was acknowledged")
            except Exception as exc:  # noqa: BLE001 - expected
                why = error_text(exc, 200)
        finally:
            w.close()
        bad = expect_only(b, sub, {1: base}, "after ENOSPC")
        if bad:
            return Check("full_disk", "fail", bad[0], {"violations": bad})
        return Check("full_disk", "pass", f"ENOSPC reported, not acknowledged; step 1 intact ({why[:120]})", {"error": why})
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20)
        shutil.rmtree(mnt, ignore_errors=True)


def durable_medium(b: Bench) -> Check:
    """The checkpoints live on a medium that survives a node crash: never a memory-backed file system.

    Found from the mount that holds the target (``/proc/self/mountinfo``), never guessed from
    its path: a tmpfs, a ramfs or a zram device loses every checkpoint, acknowledged or not,
    when the node crashes, reboots or loses power. Such a mount is for staging only.
    """
    if b.target.kind != "posix":
        return Check("durable_medium", "not_judged", f"a {b.target.kind} backend: whether its service keeps data "
                     "across a crash of its own nodes is not something a client can see; not tested")
    from faults.disk import memory_backed, mount_of

    m = mount_of(b.target.location())
    if m is None:
        return Check("durable_medium", "not_judged", f"no mount in /proc/self/mountinfo holds {b.target.location()}")
    where = {k: m[k] for k in ("mount_point", "fstype", "source")}
    if memory_backed(m):
        return Check("durable_medium", "fail",
                     f"{b.target.location()} is on a memory-backed file system ({m['fstype']} {m['source']} at "
                     f"{m['mount_point']}): a node crash, reboot or power loss loses every checkpoint on it, "
                     "acknowledged or not. Staging only: save here, then upload to durable storage with its own "
                     "commit protocol", where)
    return Check("durable_medium", "pass", f"{m['fstype']} ({m['source']}) at {m['mount_point']}: kept on a device, "
                 "not in memory only (what a power loss keeps of a save is commit_atomicity's and the power-loss "
                 "scenario's to show)", where)


def client_crash(b: Bench, max_points: int = 40) -> Check:
    """The mount's storage client (its FUSE daemon) crashes before, inside and after a save's operations.

    Each crash is followed by a fresh mount (the daemon's own command line, or
    ``--remount``) and a fresh reader: every listed step loads bit-exact, ``latest`` names a
    committed step, and a save acknowledged before the crash is there. Mounts without a
    daemon of their own (a kernel file system) have nothing to crash here: ``n/a``.
    """
    if b.target.kind != "posix":
        return Check("client_crash", "not_judged", f"a {b.target.kind} backend is reached by this process's own "
                     "client: its crash is the checkpointer's, which commit_atomicity kills")
    from chaos.certify import clientcrash
    from faults.errors import Unsupported
    from faults.fusemount import find_daemon

    try:
        daemon = find_daemon(b.target.location())
    except Unsupported as exc:
        return Check("client_crash", "not_judged", f"{exc}: no storage client of its own to crash "
                     "(a crash of the checkpointer is commit_atomicity's)")
    if shutil.which("strace") is None:
        return Check("client_crash", "not_judged", f"{daemon.describe()}: strace is not installed, and the crashes "
                     "inside an operation (at the daemon's upstream requests) need it; not tested")
    sub = "client"
    base, nxt = make_state(1, b.small, b.seed), make_state(2, b.small, b.seed)
    b.save_once(sub, 1, base)
    root = parse_url(b.target.url(sub)).location

    def save_two() -> None:
        b.ckpt(sub).save(2, nxt)  # no close(): nothing after the acknowledgement may matter

    def judge(acknowledged: bool) -> list[str]:
        bad = expect_only(b, sub, {1: base, 2: nxt}, "after the client crash")
        if acknowledged:
            r = b.reader(sub)
            try:
                steps, latest = r.store.list_steps(), r.store.read_latest()
            finally:
                r.close()
            if 2 not in steps or latest != 2:
                bad.append(f"the save of step 2 was acknowledged before the crash, but a fresh mount lists "
                           f"{steps} with latest {latest}: an acknowledged save was lost")
        return bad

    description = daemon.describe()
    ops, by_request = clientcrash.count(daemon, save_two)
    reset_to_one(b, sub)
    outcomes = []
    for point in clientcrash.plan(ops, max_points):
        outcome, daemon = clientcrash.run_point(daemon, save_two, point, ops, by_request, judge, lambda: _listing(root),
                                                lambda: reset_to_one(b, sub), b.target.remount)
        outcomes.append(outcome)
    bad = [o for o in outcomes if o.violations]
    ev = {"daemon": description, "remount": list(b.target.remount or daemon.argv),
          "ops": [o.describe() for o in ops], "counted": "mutating HTTP requests" if by_request else "sends", "points": len(outcomes),
          "tried": [o.to_dict() for o in outcomes], "violations": [f"{o.where}: {v}" for o in bad for v in o.violations][:20]}
    if bad:
        first = bad[0]
        seen = ", ".join(x for x in first.listing if "step-" in x)[:300]
        return Check("client_crash", "fail", f"{daemon.fstype} client killed {first.where}; mounted again, a fresh "
                     f"reader found: {first.violations[0]} (the directory held: {seen})", ev)
    inside = sum(1 for o in outcomes if o.point.sends)
    return Check("client_crash", "pass", f"{len(outcomes)} crashes of the {daemon.fstype} daemon ({inside} at an "
                 f"upstream {'request' if by_request else 'send'} inside an operation) over {len(ops)} operations, each mounted again: every listed step loads, latest "
                 "committed, acknowledged saves kept", ev)


def _listing(root: str, limit: int = 200) -> list[str]:
    """What a checkpoint directory holds, directories with a trailing slash (links not followed)."""
    out: list[str] = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, d)) + "/" for d in sorted(dirs)]
        out += [os.path.normpath(os.path.join(rel, f)) for f in sorted(files)]
        if len(out) >= limit:
            break
    return sorted(out)[:limit]


def orphan_cleanup(b: Bench) -> Check:
    """Leftovers of crashed saves (temp dirs, data, uncompleted uploads) are removed at the next start; commits stay."""
    sub = "orphans"
    base, save_two, ops, _, idx = _one_committed_then_count_shard_writes(b, sub)
    run_crashing(save_two, idx[len(idx) // 2] + 1 if len(idx) >= 2 else max(1, len(ops) // 2))
    before = b.target.leftovers(sub)
    fresh = b.ckpt(sub)  # rank 0 start-up cleans
    fresh.close()
    after = b.target.leftovers(sub)
    bad = expect_only(b, sub, {1: base}, "after cleanup")
    ev = {"before": before, "after": after}
    if not any(before.values()):
        return Check("orphan_cleanup", "fail", "the crashed save left nothing to clean: the check did not exercise cleanup", ev)
    if any(after.values()) or bad:
        return Check("orphan_cleanup", "fail", bad[0] if bad else f"orphans remain after start-up cleanup: {after}", ev)
    return Check("orphan_cleanup", "pass", f"removed {sum(len(v) for v in before.values())} orphan(s) at start-up; step 1 intact", ev)


def block_power_loss(b: Bench) -> Check:
    """Block-level crash states of the target's own file system type and options (:mod:`chaos.certify.blockcrash`).

    Imported when it runs: it needs FUSE and loop devices, which the other properties do not.
    """
    from chaos.certify.blockcrash import block_power_loss as explore

    return explore(b)


PROPERTIES: list[tuple[str, Callable[[Bench], Check]]] = [
    ("read_after_write", read_after_write),
    ("checksums_round_trip", checksums_round_trip),
    ("commit_atomicity", commit_atomicity),
    ("client_crash", client_crash),
    ("partial_invisible", partial_invisible),
    ("concurrent_writers", concurrent_writers),
    ("dropped_connection", dropped_connection),
    ("full_disk", full_disk),
    ("orphan_cleanup", orphan_cleanup),
    ("durable_medium", durable_medium),
    ("block_power_loss", block_power_loss),
]


def run_battery(target: Target, scratch: str, seed: int = 0, only: list[str] | None = None,
                progress: Callable[[str], None] | None = None) -> list[Check]:
    b = Bench(target, scratch, seed)
    out = []
    for name, fn in PROPERTIES:
        if only and name not in only:
            continue
        if progress:
            progress(name)
        out.append(_guard(name, lambda fn=fn: fn(b)))
    return out
