"""``power``: a power loss right after one traced event — every pending change lost, or one of the cut's other states.

{out} is replaced by a crash state (``faults.crashstate.CrashModel``) of the merged attempt-0
traces of every rank up to the moment rank R halted, from {out} as it was before attempt 0:
the state where every pending change is lost (data written since its file's last fsync,
directory entries created, renamed or removed since their directory's last fsync) or, for
``rankR:opN:power:sK``, the k-th of the cut's other distinct states (some of it kept: a
file's data without its directory entry, an entry without its data, a write torn). Points:
every event after which something was pending in the fault-free run (a power loss there
differs from a kill), every event where the model cannot say; up to ``POWER_STATES`` mixed
states per cut beside the worst case (:func:`pending_after` says where, for the planner).

:func:`power_loss` builds the state. A trace the model cannot represent (``FaultError``) is
a skip with the model's reason; so is a moment when nothing was pending (the state is what
a kill leaves: the ``after`` point of the same event covers it), and a mixed state the cut
does not have. The job's TMPDIR is emptied too, as a reboot empties /tmp. A file under
{out} whose bytes at the cut no traced event explains (a native writer the tracer does not
see) is no part of the model: it is left as it was at the cut (a state a power loss can
leave whether or not its writer synced it), never dropped in silence, and the record
(``untraced``) and the line name it. The family's protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections.abc import Iterable
from typing import Any

import xxhash

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied, files_under, merged_records, point_seed, untraced_one
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import Anchors, Facts, Traces, event_keys
from faults import FaultError
from faults.crashstate import CrashModel, Snapshot, clear

POWER_STATES = 3  # mixed power-loss states per cut (``rankR:opN:power:sK``), beside everything-lost
MIXED_EXHAUSTIVE = 4096  # a power point's mixed state: every crash state looked at up to this many in all,
MIXED_SAMPLES = 256      # else this many drawn with the point's seed


def _all_lost(model: CrashModel, seed: int) -> Any:
    """The crash state after the whole trace in which every pending change is lost."""
    last = model.n_prefixes - 1
    states = model.generate(seed=seed, exhaustive_limit=0, samples=2).states
    for st in states:
        if st.prefix == last and all(v == 0 for v in st.dirs.values()) and all(
                tuple(v) == (0, 0) for v in st.data.values()):
            return st
    raise FaultError("the crash model offered no all-pending-lost state of the last prefix")


def power_loss(point: Point, out: str, scratch: str, halt: dict[str, Any], base: Snapshot, seed: int,
               attempts: tuple[int, ...] = (0,)) -> Applied:
    """Replace {out} by the all-pending-lost crash state at rank R's halt; skip if the model cannot.

    A file under {out} that changed in a way no traced event explains (written by a native
    writer the tracer does not see, moved into place from such a file: ``_untraced_at_cut``)
    is no part of the model, whose state would silently drop it. It is left as it was at the
    cut — a state a power loss can leave whether or not its writer synced it — and named in
    the record (``untraced``) and in the line; where the crash state lost its directory, or
    the traced entry that named it, it is gone with them, and the record says so.

    ``attempts``: whose records, in order, lead from ``base`` to the cut: attempt 0 for a point's
    own power cut; for one in a restart (:func:`in_restart`), every attempt since ``base``."""
    cut = halt.get("ts")
    s = point_seed(seed, point)
    record: dict[str, Any] = {"seed": s, "cut": {"rank": point.rank, "event": point.op, "op": halt.get("op"),
                                                "ts": cut}, "choice": "all-pending-lost",
                              "base_files": sorted(base.files)}
    try:
        every = [r for a in attempts for r in merged_records(scratch, a)]  # each attempt ended before the next
        upto = [r for r in every if cut is None or r.get("ts", 0.0) <= cut]
        model = CrashModel(out, base, upto, seed=s)
        last = model.n_prefixes - 1
        record["combinations_at_cut"] = model.count(last)
        record["ops_replayed"] = len(model.ops)
        if model.count(last) == 1:
            return Applied("power loss with nothing pending", record, cut_ts=cut,
                           skipped=f"nothing was pending after rank {point.rank}'s event {point.op}: a power loss "
                                   f"there leaves what a kill does (point rank{point.rank}:op{point.op}:after)")
        if point.state is not None:
            record["choice"] = f"mixed state {point.state}"
        state = _all_lost(model, s) if point.state is None else _mixed(model, s, point.state)
        if isinstance(state, str):
            return Applied("power loss", record, skipped=state, outcome="no_effect", cut_ts=cut)
        untraced, expected = _untraced_at_cut(out, base, every, upto, model, s)
        if isinstance(untraced, str):
            record["untraced_not_checked"] = untraced
            untraced = []
        before = {os.path.relpath(p, out) for p in files_under(out)}
        aside = os.path.join(scratch, "untraced-at-cut")
        for u in untraced:
            if u["size_after"] is not None:
                os.makedirs(os.path.dirname(os.path.join(aside, u["file"])), exist_ok=True)
                shutil.copy2(os.path.join(out, u["file"]), os.path.join(aside, u["file"]))
        clear(out)
        model.materialize(state, out)
        for u in untraced:
            u["kept"] = _restore(out, aside, u, expected)
        shutil.rmtree(aside, ignore_errors=True)
    except FaultError as exc:
        return Applied("power loss", record, skipped=f"the crash-state model cannot represent this trace: {exc}",
                       outcome="unsupported", cut_ts=cut)
    tmp = os.path.join(scratch, "tmp")
    if os.path.isdir(tmp):
        clear(tmp)
    after = {os.path.relpath(p, out) for p in files_under(out)}
    record.update(state=state.id, lost=state.lost, files_before=sorted(before), files_after=sorted(after))
    lost = "; ".join(_lost_line(x) for x in state.lost[:4]) + (" ..." if len(state.lost) > 4 else "")
    what = f"power loss right after rank {point.rank}'s event {point.op}: {lost}"
    if untraced:
        record["untraced"] = untraced
        what += "; " + "; ".join(f"{untraced_one(u)}: {u['kept']}" for u in untraced[:3]) + (
            " ..." if len(untraced) > 3 else "")
    return Applied(what, record, cut_ts=cut)


def _digest_file(path: str) -> bytes:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.digest()


def _untraced_at_cut(out: str, base: Snapshot, every: list[dict[str, Any]], upto: list[dict[str, Any]],
                     model: CrashModel, seed: int) -> tuple[list[dict[str, Any]] | str, set[str]]:
    """The files under {out} at the cut whose bytes differ from what every traced event of the attempt
    (all ranks, the cut's later events too: they happened before every copy stopped) leaves there, and
    the files those events leave. A string instead: why it could not be checked."""
    try:
        full = model if len(upto) == len(every) else CrashModel(out, base, every, seed=seed)
    except FaultError as exc:
        return f"the whole attempt's trace cannot be modelled: {exc}", set()
    last = full.n_prefixes - 1
    kept = full.state(last, *full.extreme_choices(last)[1])  # every traced change made: what the trace explains
    expected = full.file_digests(kept)
    actual = {os.path.relpath(p, out): p for p in files_under(out) if os.path.isfile(p) and not os.path.islink(p)}
    odd = sorted(rel for rel in set(actual) | set(expected)
                 if rel not in actual or rel not in expected or _digest_file(actual[rel]) != expected[rel])
    if not odd:
        return [], set(expected)
    _dirs, files = full.contents(kept)
    found = []
    for rel in odd:
        now = os.path.getsize(actual[rel]) if rel in actual else None
        traced = len(files[rel]) if rel in files else None
        how = ("written by no traced event" if traced is None else "removed by no traced event" if now is None
               else "changed by no traced event")
        found.append({"file": rel, "size_before": traced, "size_after": now, "how": how})
    return found, set(expected)


def _restore(out: str, aside: str, u: dict[str, Any], traced: set[str]) -> str:
    """Put an untraced file back as it was at the cut, where the crash state lets it be; what was done."""
    path = os.path.join(out, u["file"])
    if u["size_after"] is None:
        if os.path.lexists(path):
            os.unlink(path)
        return "absent, as it was at the cut"
    if not os.path.isdir(os.path.dirname(path)):
        return "lost with its directory, which the crash state lost"
    if u["file"] in traced and not os.path.lexists(path):
        return "lost with the traced directory entry that named it, which the crash state lost"
    shutil.copy2(os.path.join(aside, u["file"]), path)
    return "kept as it was at the cut (its durability unknown)"


def _mixed(model: CrashModel, seed: int, k: int) -> Any:
    """The k-th of the cut's other distinct states (neither everything lost nor nothing lost), in
    an order drawn with ``seed``; a string saying why there is none when the cut has fewer.

    Only states of the cut itself (every traced op issued, then the power goes): all of them
    up to ``MIXED_EXHAUSTIVE`` combinations, else ``MIXED_SAMPLES`` drawn with the seed."""
    last = model.n_prefixes - 1
    total = model.count(last)
    if total <= MIXED_EXHAUSTIVE:
        choices: Iterable[Any] = model.all_choices(last)
    else:
        rng = random.Random(seed)
        choices = (model.random_choice(last, rng) for _ in range(MIXED_SAMPLES))
    worst, kept = (model.fingerprint_choice(last, *ch) for ch in model.extreme_choices(last))
    distinct: dict[str, Any] = {}
    for ch in choices:
        fp = model.fingerprint_choice(last, *ch)
        if fp not in (worst, kept):
            distinct.setdefault(fp, ch)
    mixed = sorted((model.state(last, *ch) for ch in distinct.values()), key=_stable_key)
    mixed = [st for st in mixed if st.lost]
    random.Random(seed).shuffle(mixed)
    if k > len(mixed):
        drawn = "" if total <= MIXED_EXHAUSTIVE else f" ({MIXED_SAMPLES} of them drawn)"
        return (f"the cut's {total} combinations of pending changes{drawn} leave only {len(mixed)} distinct "
                f"crash state(s) besides everything lost and nothing lost (the others leave the same files: "
                f"a change kept or lost there makes no difference to what is on disk); this point asks for "
                f"state {k}")
    return mixed[k - 1]


def _stable_key(st: Any) -> str:
    """An order of crash states that does not depend on inode numbers or on the random names of
    temp files outside {out} (both differ between runs of the same job), only on what each loses."""
    def one(x: dict[str, Any]) -> tuple[str, ...]:
        where = [str(x.get(k)) if not os.path.isabs(str(x.get(k) or "")) else "<outside>" for k in ("path", "src")]
        return (str(x.get("what")), str(x.get("op")), *where, str(x.get("persisted")), str(x.get("pending")),
                str(x.get("torn")))
    return json.dumps(sorted(one(x) for x in st.lost))


def _lost_line(x: dict[str, Any]) -> str:
    if x.get("what") == "data":
        pending, kept = x.get("pending", 0), x.get("persisted", 0)
        if x.get("torn"):
            return f"{x.get('path')}: {kept} of {pending} unsynced byte(s) kept, a write torn"
        ops, ops_kept = x.get("ops_pending"), x.get("ops_persisted")
        if ops is not None and ops_kept is not None and ops_kept > 0:  # some of its changes made it, not all
            return (f"{x.get('path')}: the last {ops - ops_kept} of {ops} unsynced change(s) lost "
                    f"({pending - kept} byte(s))")
        return f"{x.get('path')}: {pending - kept} unsynced byte(s) lost"
    op = x.get("op")
    if op == "rename":
        return f"rename {x.get('src')} -> {x.get('path')} lost (directory not fsynced)"
    return f"{op} of {x.get('path')} lost (directory not fsynced)"


def pending_after(out: str, records: list[dict[str, Any]]) -> dict[tuple[int, int], int] | str:
    """(rank, ord) of every event after which a power loss would lose something (fault-free run),
    with how many crash states (combinations) the model counts right after it.

    A string instead: the model's reason why it cannot represent the trace (every event
    then gets a power point, and each is judged, or skipped, at its own cut).
    """
    try:
        model = CrashModel(out, Snapshot(), records)
    except FaultError as exc:
        return str(exc)
    if model.n_prefixes != len(model.ops) + 1:  # some op made no prefix: events cannot be matched to them
        return "the crash-state model skipped some events of the trace"
    found = {}
    for i, rec in enumerate(model.ops):
        if rec.get("ord") is not None and model.count(i + 1) > 1:
            found[(rec.get("rank", 0), rec["ord"])] = model.count(i + 1)
    return found


def gather(out: str, scratch: str, facts: Facts) -> None:
    """After which events of the fault-free run something was pending (``Facts.pending``)."""
    facts.pending = pending_after(out, atrest.merged_records(scratch, 0))


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The worst case at every event with something pending (every event where the model cannot
    say), then a few of the cut's mixed states, drawn by :func:`power_loss` with the seed."""
    anchors = Anchors(traces, facts.stable)
    pending = facts.pending
    out: list[Point] = []
    for rank, r, path, nth in event_keys(traces):
        if isinstance(pending, dict) and (rank, r["ord"]) not in pending:
            continue
        worst = anchors.at_event(rank, r, path, nth, "power")
        mixed = pending.get((rank, r["ord"]), 0) - 2 if isinstance(pending, dict) else 0
        out += [worst, *(dataclasses.replace(worst, state=k) for k in range(1, min(POWER_STATES, mixed) + 1))]
    return out


def prepare(out: str) -> Snapshot:
    """{out} before attempt 0: the base every crash state starts from."""
    return Snapshot.capture(out)


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, prepared: Any = None) -> Applied:
    return power_loss(point, out, scratch, halt, prepared if prepared is not None else Snapshot(), seed)


def in_restart(then: Point, out: str, scratch: str, traces: Traces, base: Snapshot, attempts: tuple[int, ...],
               seed: int) -> Applied:
    """A point's second fault, a power cut right after event ``then.op`` of its restart (``attempts[-1]``).

    Called by ``chaos.run.explore`` once that restart halted, before the next one. A power cut
    loses what is pending since ``base``, not only in the restart: what attempt 0 wrote and
    never synced is lost too where the first fault left the page cache as it was (a kill, a
    SIGTERM, an injected error: ``base`` is {out} before attempt 0, ``attempts`` 0 and 1); after
    a first fault the harness made on {out} (a power loss, a corruption), ``base`` is {out} as
    the restart found it and ``attempts`` the restart alone. A restart that never reached the
    event is skipped as not reached."""
    halt = atrest.halt_record(traces, then.rank, attempts[-1])
    if halt is None:
        return Applied("no power cut in the restart", {"event": then.op}, outcome="not_reached",
                       skipped=f"the restart never reached rank {then.rank}'s event {then.op}, where the power cut "
                               "was to be")
    return power_loss(then, out, scratch, halt, base, seed, attempts)


def notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    if not isinstance(facts.pending, str):
        return []
    return [f"power loss: the crash-state model cannot represent the whole fault-free trace ({facts.pending}); "
            "every event gets a power point, skipped where its own cut cannot be modelled either"]


FAMILY = AtRestFamily(name="power", points=points, apply=apply, gather=gather, prepare=prepare, notes=notes)
