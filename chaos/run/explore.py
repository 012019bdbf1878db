"""Explore a job: two fault-free runs, the points their traces show, then each point run and judged.

Called by ``cli_job.py``. All of it happens inside one scratch root (``--scratch`` or
the system temp directory), removed at the end unless ``--keep``: per run a folder with
``out/`` (the job's {out}), ``trace/`` (each traced process's trace and probe file),
``logs/`` (each copy's output) and ``tmp/`` (the job's TMPDIR).

1. Fault-free runs, twice. If their result files differ the job is nondeterministic:
   *tolerance mode* (results compared within ``--rtol``), and the caller says so.
2. Points, from the first fault-free run's traces, of every ``--faults`` kind
   (``pointset.py``): kills at file events and steps, SIGTERM at steps, injected
   ENOSPC / EIO, at-rest corruption of the checkpoint files, power loss, a full disk.
3. A seeded sample of them (``--max-points``; ``pointset.plan``: one point of every class
   first, every family, each save's end, ..., then draws spread over the kinds), run
   ``--jobs`` at a time, in that order, while ``--budget`` seconds allow; coverage =
   points tried / points found, and the classes tried are a note.
4. Each point (``run_chain``): attempt 0 with the point armed; for a corruption or a
   power loss, {out} edited while every copy is stopped (``atrest.py``); for a full
   disk, attempt 0 on a small tmpfs that is grown before the restart (``diskfull.py``);
   for a network cut, attempt 0 in which the armed rank's link goes down for
   ``--net-hold`` seconds (``netcut.py``); then (unless torchrun restarts by itself) up
   to ``--max-restarts`` resumes with ``--resume-cmd``; then ``judge.judge``. Right
   after attempt 0, before the harness touches {out}, the record takes what the job
   left: the ``--checkpoint-glob`` matches (what it relied on is judged on these, not
   on a crash state) and the files no traced event explains (``untraced_after``). A
   full disk no traced event hit is still judged where attempt 0 failed or its output
   says ENOSPC (a native writer hit it); otherwise it is *skipped* only if every oracle
   passes.

An interrupt (Ctrl-C; a SIGTERM, which ``cli_job`` turns into one) is no fault of the
job: every attempt stops at once (``launch.cancel``), a point whose chain it cut short
is recorded with outcome *interrupted* (verdict ``skipped``), never judged, and
``explore`` raises :class:`Interrupted` with what was done, once nothing of the run is
left. A ``--result-file`` that matched nothing in the fault-free run is a usage error
(``check_result_globs``) before any point runs.

Where network cuts are explored (``netcut.usable``), the chain of every network-cut
point, and the second fault-free run (which shows that the job runs the same way there:
its results and its events are compared with the first's), gets its own ``NetworkLab``:
each copy in its rank's network namespace, torn down with the chain (and once more, with
anything an interrupt left, in ``explore``'s ``finally``). Every other chain runs outside
one, where its copies may be forked from the zygotes or started ahead as spares.
A ``--nodes N`` job runs every chain on N simulated nodes of its own lab (``nodes.py``:
one torchrun agent per namespace); a node point that left every agent failed is
relaunched like a torchrun job stopped by the harness (``_restarts``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import errno
import functools
import glob
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from chaos.errors import ChaosError, ConfigError
from chaos.judge import losscurve
from chaos.judge.compare import first_difference
from chaos.judge.job import Golden, PointVerdict, judge, last_steps, resumed_at, step_of
from chaos.launch import job as launch
from chaos.launch import preload, sbatch, spares, zygote
from chaos.launch.output import cause, clip
from chaos.launch.preload import Choice
from chaos.model.jobspec import HALT_MODES, TORCHRUN_STRIDE, JobSpec, Point
from chaos.nemesis import atrest, diskfull, family, netcut, newest, nodes, power, shrink
from chaos.nemesis.sites import event_keys
from chaos.plan import pointset, resumepoints, translate
from chaos.plan.pointset import Facts
from chaos.record.jobhistory import PointRecord, read_traces
from chaos.run import materialize
from chaos.scratch import make_root
from faults import FaultError, disk

if TYPE_CHECKING:
    from chaos.launch.protocol import AttemptLauncher
    from faults.network import NetworkLab


_ENOSPC = re.compile(r"No space left on device|Errno 28\b|ENOSPC")


class JobError(ChaosError):
    """The job cannot be explored (its fault-free run failed, nothing was traced): exit 2."""


def checkpoint_state(out: str, pattern: str | None) -> dict[str, dict[str, int]] | None:
    """``--checkpoint-glob`` matches under {out}: name -> {file: size} (a directory: every file in it)."""
    if pattern is None:
        return None
    rel = pattern.replace("{out}/", "").replace("{out}", "")
    state: dict[str, dict[str, int]] = {}
    for match in sorted(glob.glob(os.path.join(out, rel))):
        name = os.path.relpath(match, out)
        if os.path.isdir(match):
            state[name] = {os.path.relpath(os.path.join(d, f), match): os.path.getsize(os.path.join(d, f))
                           for d, _s, files in os.walk(match) for f in files}
        elif os.path.isfile(match):
            state[name] = {"": os.path.getsize(match)}
    return state


def result_files(job: JobSpec, out: str) -> list[str]:
    rels: set[str] = set()
    for g in job.relative_globs(job.result_globs):
        rels |= {os.path.relpath(p, out) for p in glob.glob(os.path.join(out, g), recursive=True)
                 if os.path.isfile(p)}
    return sorted(rels)


def check_result_globs(job: JobSpec, out: str) -> None:
    """ConfigError (exit 2, before any point runs) where a ``--result-file`` matches no file the fault-free
    run left under {out}.

    Called by :func:`reference` on the first fault-free run's {out}. Such a glob (``final.pth``
    for a job that writes ``final.pt``) is a typo, never a fact about the job: nothing would be
    compared after any point, and every point would pass with silent divergence not judged.
    """
    left: list[str] | None = None
    for given, rel in zip(job.result_globs, job.relative_globs(job.result_globs), strict=True):
        if any(os.path.isfile(p) for p in glob.glob(os.path.join(out, rel), recursive=True)):
            continue
        if left is None:
            left = sorted(os.path.relpath(os.path.join(d, f), out) for d, _s, files in os.walk(out) for f in files)
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "") if left else "nothing"
        raise ConfigError(f"--result-file {given!r} matched no file the fault-free run left under {{out}} (it left "
                          f"{shown}): give a file the job writes, relative to {{out}}")


@dataclass
class Run:
    """One attempt chain in its own folder."""

    scratch: str
    out: str
    mark: str
    attempts: list[launch.AttemptOutcome] = field(default_factory=list)
    lab: NetworkLab | None = None  # where every copy runs, each rank in its namespace (network cuts explored)
    prestart: bool = False  # start the restart's copies while attempt 0 runs (launch.prestart)
    replay_from: str | None = None  # a fault-free run's scratch: attempt 0 rebuilt from it (materialize.py)

    def attempt(self, job: JobSpec, attempt: int, point: Point | None) -> launch.AttemptOutcome:
        if self.prestart and attempt == 0 and point is not None and job.max_restarts > 0:
            launch.prestart(job, self.out, self.scratch, 1, point.then, self.mark, self.lab)
        if job.launcher == "sbatch":  # one Slurm job: its requeued runs are the next attempts
            runs = sbatch.run_attempts(job, self.out, self.scratch, attempt, point, self.mark)
            self.attempts += runs
            return runs[-1]
        run_attempt: AttemptLauncher = nodes.run_attempt if job.nodes is not None else launch.run_attempt
        out = run_attempt(job, self.out, self.scratch, attempt, point, self.mark, self.lab)
        self.attempts.append(out)
        return out


def new_run(root: str, name: str) -> Run:
    """A run chain's folder under the scratch root (``golden-0``, ``point-00007``): {out}, trace, logs, tmp."""
    scratch = os.path.join(root, name)
    out = os.path.join(scratch, "out")
    os.makedirs(out, exist_ok=True)  # made already where the point's first attempt was prestarted
    return Run(scratch, out, scratch)


def _restarts(job: JobSpec, run: Run, point: Point, watch: Callable[[int], None] | None = None) -> None:
    """The harness's restarts: none for a torchrun COMMAND its agent restarts by itself, except
    after a SIGTERM, a corruption or a power loss, which stopped torchrun too, and after a
    full disk: the agent's own restarts met the same full disk, and a job that gave up on it
    is relaunched once the disk has room again, as whoever freed the space would. A
    SIGTERM'd job is restarted even when it exited 0: it was preempted, not finished.
    ``watch(attempt)`` runs after each restart (an at-rest family's ``watch``: a payload's marker).
    A point with a second fault (``point.then``) arms it in the first restart, and has one
    restart more than ``--max-restarts`` for it. After a rank lost for good (a kill with
    ``lost=true``) the restarts run on one rank fewer (``shrink.restart_job``)."""
    fam = family.families()[point.family]
    if fam.scheduler_restarts:
        return  # Slurm reran the job itself (sched): its runs are attempt 0's launch's attempts already
    if job.torchrun and not fam.restarts_torchrun:
        return  # a node point's agents that all failed are relaunched, as a scheduler restarts a failed job
    if point.lost:
        job = shrink.restart_job(job, point, read_traces(run.scratch, run.out))
    for attempt in range(1, job.max_restarts + (2 if point.then is not None else 1)):
        if run.attempts[-1].ok and not (attempt == 1 and fam.preempts):
            break
        run.attempt(job, attempt, point.then if attempt == 1 else None)
        if watch is not None:
            watch(attempt)


def _halting(point: Point) -> family.AtRestFamily:
    fam = family.of_mode(point.mode)
    if fam is None:
        raise ChaosError(f"point {point.id}: {point.mode!r} halts every copy, but no family module carries it")
    return fam


def _at_rest(run: Run, point: Point, fam: family.AtRestFamily, prepared: Any, seed: int) -> atrest.Applied | None:
    """After a halted attempt 0: what the point's family does to {out} (a corruption, a stale copy,
    a swap, a payload, reordered writes, a power loss); None when the point never fired."""
    traces = read_traces(run.scratch, run.out)
    halt = atrest.halt_record(traces, point.rank)
    if halt is None:
        return None
    if point.strikes_newest:  # the built-in ckpt:stepS:KIND: the newest checkpoint's file, its own edit
        return newest.apply(point, run.out, run.scratch, halt, seed, traces)
    return fam.apply(point, run.out, run.scratch, halt, seed, prepared)


def _diskfull_chain(job: JobSpec, run: Run, point: Point) -> PointRecord:
    """Attempt 0 on a ``point.size``-byte tmpfs {out}, grown before the restarts; skipped where none mounts.

    A disk filled at a step (``point.step``, the built-in ``disk:stepS:full,free=B``): attempt 0 on a
    roomy tmpfs, which the launcher shrinks to what it holds plus B bytes when rank 0 announces the
    step (``diskfull.fill``), grown back before the restarts."""
    at_step = point.step is not None
    size = diskfull.roomy_size() if at_step else int(point.size or 0)
    what = (f"{{out}} filled at step {point.step}, leaving {point.size} byte(s)" if at_step else
            f"{{out}} on a {size}-byte tmpfs")
    ok, why = diskfull.available()
    if not ok:
        applied = atrest.Applied(what, {"size_bytes": size},
                                 skipped=f"a real full disk cannot be made here: {why}", outcome="unsupported")
        return PointRecord(point, run.out, run.attempts, {}, None, applied)
    grown = size if at_step else diskfull.grown_size(size)
    stack = contextlib.ExitStack()
    try:
        fs = stack.enter_context(diskfull.tmpfs_out(run.out, size, run.scratch))
    except (OSError, FaultError) as exc:
        applied = atrest.Applied(what, {"size_bytes": size},
                                 skipped=f"the tmpfs could not be mounted over {{out}}: {exc}", outcome="unsupported")
        return PointRecord(point, run.out, run.attempts, {}, None, applied)
    with stack:
        before = _sizes(run.out)
        run.attempt(job, 0, point)
        untraced = untraced_after(job, run, before)
        fs.grow(grown)
        after_kill = checkpoint_state(run.out, job.checkpoint_glob)
        _restarts(job, run, point)
    traces = read_traces(run.scratch, run.out)
    hit = sorted(({**r, "rank": rank} for (rank, a), recs in traces.items() if a == 0 for r in recs
                  if r.get("event") == "op" and r.get("error") == errno.ENOSPC), key=lambda r: r.get("ts", 0))
    record: dict[str, Any] = {"size_bytes": size, "mount": fs.record, "remounted_to": grown}
    if untraced:
        record["untraced"] = untraced
    first_try = run.attempts[0]
    if at_step:
        filled = first_try.fill
        record["filled"] = filled
        if filled is None or filled.get("error"):
            why = (filled or {}).get("error") or f"rank 0 announced no step {point.step} in attempt 0"
            applied = atrest.Applied(what, record, skipped=f"the disk was never filled: {why}", outcome=(
                "unsupported" if filled else "not_reached"))
            return PointRecord(point, run.out, run.attempts, traces, after_kill, applied, None, untraced)
        what += f" (its tmpfs shrunk to {filled['remounted_to']} bytes, {filled['in_use_bytes']} in use)"
    said = clip(cause(first_try.tail(12000))) if not first_try.ok else ""
    full = _ENOSPC.search(first_try.tail(12000))
    if hit:
        first = hit[0]
        record["first_enospc"] = {k: first.get(k) for k in ("rank", "ord", "op", "rel", "seq")}
        applied = atrest.Applied(f"{what}: rank {first['rank']}'s {first['op']} of "
                                 f"{first.get('rel')} (event {first.get('ord')}) got ENOSPC; remounted at "
                                 f"{grown} bytes before the restart", record)
    elif not first_try.ok or full:
        # No traced event failed, yet the full disk changed the outcome: the fault-free run finished,
        # this attempt did not (or its output says ENOSPC). Whatever hit it writes where the tracer
        # does not see (a native writer, a child process): judged, never "did nothing".
        how = (f"attempt 0 {first_try.describe}" + (f" ({said})" if said else "") if not first_try.ok
               else f"attempt 0 finished, its output saying {full.group(0)!r}" if full else "")
        record["untraced_enospc"] = {"attempt_0": first_try.describe, "cause": said or None,
                                     "output": full.group(0) if full else None}
        seen = f"; {atrest.untraced_line(untraced)}" if untraced else ""
        applied = atrest.Applied(f"{what}: no traced event got ENOSPC, but {how}, where "
                                 f"the fault-free run finished: the full disk hit a writer the tracer does not "
                                 f"see{seen}; remounted at {grown} bytes before the restart", record)
    else:
        applied = atrest.Applied(f"{what}, never hit by a traced event", record,
                                 idle=f"the job never hit ENOSPC on "
                                      f"{what if at_step else f'a {size}-byte tmpfs {{out}}'} (no traced event "
                                      "failed with it, attempt 0 finished with no ENOSPC in its output, and every "
                                      "oracle passed): the full disk did nothing")
    return PointRecord(point, run.out, run.attempts, traces, after_kill, applied, None, untraced)


def in_lab(netlab: bool, point: Point | None) -> bool:
    """Whether a run chain of an exploration that makes network labs (``netlab``) runs in one: a
    network-cut point's, and a fault-free one (the second fault-free run, ``reference``); any other
    point's runs outside, where its copies may be forked or started ahead. Called by :func:`run_chain`
    and :func:`_run_points` (which starts no spare for a chain in a lab)."""
    return netlab and (point is None or point.family == "net")


def run_chain(job: JobSpec, run: Run, point: Point | None, seed: int = 0, netlab: bool = False) -> PointRecord:
    """Attempt 0 (the point armed), the at-rest fault if any, then the restarts (``_restarts``).

    ``netlab``: this exploration makes network labs; then a net point's whole chain, or a
    fault-free one (no ``point``: the second fault-free run), runs in a ``NetworkLab`` of its own
    (torn down before this returns); any other point's runs outside one. A net point without one
    is skipped with the reason. A ``--nodes`` job always runs in one: a namespace per node
    (``nodes.run_chain``).
    """
    if point is not None and point.op is not None and point.op in {n for n, _ in job.import_events}:
        # An event made inside the import of a module the attempts preload: only a fresh interpreter makes it
        job = dataclasses.replace(job, preload_modules=(), zygote_preload=(), import_events=())
    if job.nodes is not None:
        return _node_chain(job, run, point, seed)
    if point is not None and point.family == "net" and not netlab:
        ok, why = netcut.usable(job)
        applied = atrest.Applied(f"no network cut at {point.id}", {"hold_s": job.net_hold_s}, outcome="unsupported",
                                 skipped=f"a network cut between ranks cannot be made here: {why}" if not ok else
                                 "a network cut between ranks needs every run in network namespaces, and this "
                                 "exploration's fault-free runs were not")
        return PointRecord(point, run.out, run.attempts, {}, None, applied)
    if not in_lab(netlab, point):
        return _chain(job, run, point, seed)
    assert job.ranks is not None
    try:
        return _chain_in_lab(job.ranks, job, run, point, seed)
    except FaultError as exc:
        if point is None:
            raise JobError(f"the network namespaces for a fault-free run could not be made: {exc}") from None
        applied = atrest.Applied(f"no network namespaces for {point.id}", {}, outcome="unsupported",
                                 skipped=f"the network namespaces for this point could not be made: {exc}")
        return PointRecord(point, run.out, run.attempts, read_traces(run.scratch, run.out), None, applied)


def _chain_in_lab(size: int, job: JobSpec, run: Run, point: Point | None, seed: int) -> PointRecord:
    """:func:`_chain` with every attempt in a NetworkLab of ``size`` namespaces (a rank's or a node's
    each), torn down after; FaultError where the lab cannot be made."""
    with netcut.lab_for(size, docker=job.launcher == "docker") as lab:
        run.lab = lab
        try:
            return _chain(job, run, point, seed)
        finally:
            run.lab = None


def _sizes(out: str) -> dict[str, int]:
    """{out}'s regular files (relative path -> size): the tree an attempt starts from."""
    return {os.path.relpath(os.path.join(d, f), out): os.path.getsize(os.path.join(d, f))
            for d, _s, files in os.walk(out) for f in files if os.path.isfile(os.path.join(d, f))
            and not os.path.islink(os.path.join(d, f))}


def untraced_after(job: JobSpec, run: Run, before: dict[str, int]) -> list[dict[str, Any]]:
    """What attempt 0 changed under {out} that no traced event explains (``atrest.untraced_changes``):
    every traced process of the attempt (a torchrun job's restarts by its agent included, and a Slurm
    job's reruns after a requeue: sbatch.run_attempts returns only once they are over)."""
    launched_once = (TORCHRUN_STRIDE if job.torchrun or job.nodes is not None
                     else len(run.attempts) if job.launcher == "sbatch" else 1)
    records = [r for (_rank, a), recs in read_traces(run.scratch, run.out).items() if a < launched_once for r in recs]
    return atrest.untraced_changes(run.out, records, before)


def _node_chain(job: JobSpec, run: Run, point: Point | None, seed: int) -> PointRecord:
    """A ``--nodes`` job's chain (:func:`_chain`) with every attempt on the nodes of one lab, torn down after."""
    ok, why = netcut.available()
    if not ok:
        if point is None:
            raise ConfigError(f"--nodes needs network namespaces (one per node): {why}")
        return PointRecord(point, run.out, run.attempts, {}, None,
                           atrest.Applied(f"no nodes for {point.id}", {}, outcome="unsupported",
                                   skipped=f"simulated nodes cannot be made here: {why}"))
    if point is not None:
        point = nodes.for_job(job, point)
    try:
        return _chain_in_lab(int(job.nodes or 0), job, run, point, seed)
    except FaultError as exc:
        if point is None:
            raise ChaosError(f"the network namespaces of the nodes could not be made: {exc}") from None
        return PointRecord(point, run.out, run.attempts, {}, None,
                           atrest.Applied(f"no nodes for {point.id}", {}, outcome="unsupported",
                                   skipped=f"the network namespaces of the nodes could not be made: {exc}"))


def _chain(job: JobSpec, run: Run, point: Point | None, seed: int) -> PointRecord:
    if point is not None and point.family == "diskfull":
        return _diskfull_chain(job, run, point)
    fam = _halting(point) if point is not None and point.mode in HALT_MODES else None
    prepared = fam.prepare(run.out) if fam is not None and fam.prepare is not None else None
    power_then = point is not None and point.then is not None and point.then.mode == "power"
    # a power cut in the restart loses what attempt 0 left pending too, unless the harness rewrote {out}
    base = power.prepare(run.out) if power_then and fam is None else None
    before = _sizes(run.out)
    zero = None
    if run.replay_from is not None and point is not None:  # materialize.why_not said it can be
        if run.prestart and job.max_restarts > 0 and spares.port_of(run.scratch, 1) is None:
            launch.prestart(job, run.out, run.scratch, 1, point.then, run.mark, run.lab)  # (unless the last point did)
        zero = materialize.attempt_zero(job, point, run.replay_from, run.out, run.scratch)
    if zero is not None:
        run.attempts.append(zero)
    else:
        run.attempt(job, 0, point)
    untraced = untraced_after(job, run, before) if point is not None else []
    # what the job left, before the harness edits it: what it relied on is judged on this
    before_fault = checkpoint_state(run.out, job.checkpoint_glob) if fam is not None else None
    applied = _at_rest(run, point, fam, prepared, seed) if fam is not None and point is not None else None
    observe = family.families()[point.family].observe if point is not None else None
    if observe is not None and point is not None:  # what the launcher did: a cut, a node lost
        applied = observe(job, point, run.attempts, lambda: read_traces(run.scratch, run.out))
    after_kill = checkpoint_state(run.out, job.checkpoint_glob) if point is not None else None
    seconds: list[atrest.Applied] = []  # what a second fault the harness makes did (a power cut in the restart)
    if point is not None and not (applied is not None and applied.skipped):
        watch = None if fam is None or fam.watch is None or applied is None else functools.partial(fam.watch, applied)
        states: list[dict[str, dict[str, int]] | None] = []
        if point.then is not None:
            strike = None
            if power_then:
                then, since = point.then, (0, 1) if base is not None else (1,)
                base = base if base is not None else power.prepare(run.out)  # {out} as the harness left it
                strike = functools.partial(_power_in_restart, then, run, base, since, seed, seconds.append)
            watch = _after_second(job, run, watch, states.append, strike)
        _restarts(job, run, point, watch)
        if states:  # the restart the second fault struck: what the last restart starts from is judged
            after_kill = states[0]
        if fam is not None and fam.settle is not None and applied is not None:
            fam.settle(applied, read_traces(run.scratch, run.out))
    return PointRecord(point or Point(0, "none"), run.out, run.attempts, read_traces(run.scratch, run.out),
                       after_kill, applied, before_fault, untraced, seconds[0] if seconds else None)


def _after_second(job: JobSpec, run: Run, watch: Callable[[int], None] | None,
                  keep: Callable[[dict[str, dict[str, int]] | None], None],
                  strike: Callable[[], None] | None = None) -> Callable[[int], None]:
    """``watch``, and after attempt 1 (the one a second fault struck) ``strike`` (a power cut the
    harness makes on {out} before the next restart) and ``keep`` of the checkpoints it left."""
    def both(attempt: int) -> None:
        if watch is not None:
            watch(attempt)
        if attempt == 1:
            if strike is not None:
                strike()
            keep(checkpoint_state(run.out, job.checkpoint_glob))
    return both


def _power_in_restart(then: Point, run: Run, base: Any, since: tuple[int, ...], seed: int,
                      keep: Callable[[atrest.Applied], None]) -> None:
    """The power cut of a second fault (``+rankR:opN:power``), made on {out} once its restart halted."""
    keep(power.in_restart(then, run.out, run.scratch, read_traces(run.scratch, run.out), base, since, seed))


@dataclass
class Reference:
    """The fault-free runs and what they show: the judge's golden facts, the points found."""

    golden: Golden
    points: list[Point]
    notes: list[str]
    seconds: float
    untraced: list[str]
    events: dict[int, int]  # rank -> traced file events in the first fault-free run
    kinds: tuple[str, ...] = ()  # the --faults kinds explored
    netlab: bool = False  # network cuts explored: each net point's chain, and golden-1, in network namespaces
    traces: dict[tuple[int, int], list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    facts: Facts = field(default_factory=Facts, repr=False)
    nodes: int | None = None  # --nodes: every run on that many simulated nodes, one agent each
    untraced_changes: list[dict[str, Any]] = field(default_factory=list)  # atrest.untraced_changes, fault-free
    preload: tuple[str, ...] = ()  # imported before each attempt's gate (launch.preload.choose)
    same_events: bool = True  # both fault-free runs traced the same kinds of file event, in the same order
    native_trace: bool = False  # faults/chaosio.c was preloaded: native writes and child processes traced
    # preload.choose's answer: zygote_only modules with their variables, and why spares preload nothing then
    preload_choice: Choice = field(default_factory=Choice)
    net_engine: bool = False  # --launcher docker: a lab is a network of the engine, not namespaces (containernet)
    # step K -> the fault-free resize from K's checkpoint (resized_reference), or why there is none
    resized: dict[int, Golden | str] = field(default_factory=dict, repr=False)

    def lookup(self, job: JobSpec, point: Point) -> Point:
        """A replayed point with what the fault-free run did there (any kind, asked for or not).

        A point given with its anchor (``--point rank0:op17:after@write:a.pt:2``, as replay
        commands give it) is taken as it is: it fires at that event wherever this run's
        ordinals put it, and keeps the id it was recorded with. A second fault (``point.then``)
        stays as given: the fault-free run never resumed, so only its ordinal is known.
        """
        if point.then is not None:
            return dataclasses.replace(self.lookup(job, dataclasses.replace(point, then=None)), then=point.then)
        if point.anchored:
            return point
        known = {p.id: p for p in self.points}
        if point.id not in known and point.family not in self.kinds:
            known = {p.id: p for p in pointset.enumerate_points(job, self.traces, self.facts, (point.family,))}
        return known.get(point.id, point)

    def expand(self, job: JobSpec, point: Point) -> list[Point]:
        """The points a ``--point`` runs: :meth:`lookup`'s one, or every point a built-in fault stands for
        (``all:stepS:power``: the power cuts of that save, ``chaos.plan.translate``)."""
        return [self.lookup(job, p) for p in translate.points_for(job, point, self.traces, self.facts, self.points,
                                                                   self.kinds)]

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance_mode": self.golden.tolerance, "result_files": self.golden.results,
                "checkpoints": sorted(self.golden.checkpoints), "acknowledged_saves": self.golden.acks,
                "loss_steps": {str(r): len(c) for r, c in sorted(self.golden.losses.items())},
                "notes": self.notes, "seconds": round(self.seconds, 3), "untraced_files": self.untraced,
                "untraced_changes": self.untraced_changes, "preloaded": list(self.preload),
                "native_trace": self.native_trace,
                "file_events": {str(r): n for r, n in sorted(self.events.items())},
                "peak_out_bytes": self.facts.peak or None,
                "network": "each rank's container on a network of the engine (a ContainerNetwork per run) for the "
                           "network-cut points and the second fault-free run; the host's for the others"
                if self.netlab and self.net_engine
                else "each rank in its own network namespace (a NetworkLab per run) for the network-cut "
                           "points and the second fault-free run; the host's for the others" if self.netlab
                else "each node's torchrun agent in its own network namespace (a NetworkLab per run)"
                if self.nodes else "the host's"}


_RESIZE_LOCK = threading.Lock()


def resized_reference(job: JobSpec, ref: Reference, root: str, rec: PointRecord) -> Golden | str | None:
    """What the restart of a point whose rank was lost for good is compared with: the fault-free resize
    from the checkpoint that restart resumed at (``shrink.reference_point``), run once per step in
    ``root/resized-K`` and kept in ``ref.resized``; or why there is none (a string the judge says);
    None where no rank was lost (the kill never fired).

    Called by :func:`_run_points` after a ``lost=true`` point's chain, before it is judged. Only a
    restart whose ranks all resumed at one step K has one; the fault-free run must then lose its
    rank, finish, and have every rank of its restart resume at K too."""
    lost = shrink.lost_rank(rec.point, rec.traces)
    if lost is None or job.ranks is None:
        return None
    size = job.ranks - 1
    steps = {resumed_at(rec, rank, ref.golden)[0] for rank in range(size)}
    if len(steps) != 1 or None in steps:
        shown = ", ".join("unknown" if s is None else str(s) for s in sorted(steps, key=lambda s: -1 if s is None else s))
        return f"the restart's {size} rank(s) did not all resume at one known step (resumed at: {shown})"
    step = int(next(iter(steps)))  # type: ignore[arg-type]
    with _RESIZE_LOCK:
        if step not in ref.resized:
            ref.resized[step] = _resize_run(job, ref, root, step, size)
        return ref.resized[step]


def _resize_run(job: JobSpec, ref: Reference, root: str, step: int, size: int) -> Golden | str:
    """Run the fault-free resize from ``step`` (:func:`resized_reference`) and read it as a Golden."""
    point = shrink.reference_point(job, step)
    run = new_run(root, f"resized-{step}")
    got = run_chain(job, run, point)
    if shrink.lost_rank(point, got.traces) is None:
        return (f"the fault-free run never reached {point.id} (the resize from step {step}): "
                f"no run on {size} rank(s) from that checkpoint to compare with")
    if not got.attempts[-1].ok:
        return f"the fault-free resize from step {step} ({point.id}) {got.attempts[-1].describe}"
    first = min((a for (_r, a) in got.traces if a > 0), default=None)
    if first is None:
        return f"the fault-free resize from step {step} ({point.id}) left no trace of its restart"
    for rank in range(size):
        at = resumed_at(got, rank, ref.golden)[0]
        if at != step:
            return (f"the fault-free resize ({point.id}, a clean stop right after the save of step {step}) resumed "
                    f"rank {rank} at step {at}, not {step}: no run on {size} rank(s) from that checkpoint")
    losses = losscurve.curves(got.traces, first, kind=ref.golden.loss_source)
    loaded = {rank: said[-1] for rank in range(size)
              if (said := [i for i in got.probes(lambda a: a == first, "resumed", rank) if isinstance(i.get("sha256"), str)])}
    return Golden(out=run.out, results=result_files(job, run.out), tolerance=ref.golden.tolerance, checkpoints={},
                  acks=ref.golden.acks, losses=losses, last_steps=last_steps(got.traces, first),
                  loss_source=ref.golden.loss_source, resized_from=(step, point.id), loaded=loaded)


def enumerate_points(job: JobSpec, traces: dict[tuple[int, int], list[dict[str, Any]]],
                     facts: Facts | None = None, kinds: tuple[str, ...] = ("kill",)) -> list[Point]:
    """The points of ``kinds`` (default: the kills) in the fault-free traces (``pointset.enumerate_points``)."""
    return pointset.enumerate_points(job, traces, facts, kinds)


def reference(job: JobSpec, root: str, jobs: int, seed: int = 0, netlab: bool | None = None,
              on_first: Callable[[Choice], None] | None = None) -> tuple[Reference, Run]:
    """Two fault-free runs (concurrently when ``jobs`` > 1); JobError if either fails or nothing is traced.

    ``netlab``: run the second one (and, through ``Reference.netlab``, every network-cut point) in
    network namespaces; None: where network cuts are explored and can be made here. ``on_first``
    gets what to preload as soon as it is known: with ``jobs`` 1, once the first run ended
    well and before the second starts (``explore`` starts its zygote there, so the
    zygote's imports overlap the second run).
    """
    started = time.monotonic()
    kinds, left_out = pointset.kinds_to_explore(job)
    if netlab is None:
        netlab = "net" in kinds and netcut.usable(job)[0]
    runs = [new_run(root, "golden-0"), new_run(root, "golden-1")]
    pre: Choice | None = None

    def chain(run: Run) -> PointRecord:
        nonlocal pre
        rec = run_chain(job, run, None, netlab=bool(netlab) and run is runs[1])  # the second one in a lab
        if run is runs[0] and jobs <= 1 and run.attempts and run.attempts[0].ok:
            pre = preload.choose(job, os.path.join(run.scratch, "trace"), launch.can_prestart(job))
            if on_first is not None:
                on_first(pre)
        return rec

    with cf.ThreadPoolExecutor(max_workers=min(2, max(1, jobs))) as pool:
        try:
            recs = list(pool.map(chain, runs))
        except BaseException:
            launch.cancel()  # an interrupt: the running fault-free attempt ends now, not when the job does
            raise
    for run in runs:
        a = run.attempts[0]
        if not a.ok:
            tail = a.tail(600).strip().splitlines()
            raise JobError(f"the fault-free run {a.describe}: {tail[-1] if tail else '(no output)'} "
                           f"(command: {' '.join(a.argv)})")
    traces = recs[0].traces
    notes: list[str] = []
    if not any(a == 0 for (_r, a) in traces):
        raise JobError("the fault-free run left no trace: the boot path did not run in the job's Python "
                       "(is COMMAND a Python program, or a launcher that drops PYTHONPATH?)")
    check_result_globs(job, runs[0].out)
    results = result_files(job, runs[0].out)
    tolerance = False
    for rel in results:
        other = Path(runs[1].out) / rel
        diff = "missing" if not other.exists() else first_difference(Path(runs[0].out) / rel, other, None)
        if diff:
            tolerance = True
            notes.append(f"the two fault-free runs differ ({rel}: {diff}): tolerance mode, result files "
                         f"compared within rtol {job.rtol:g}, never bit for bit")
            break
    events = {r: sum(1 for x in recs_ if x.get("event") == "op") for (r, a), recs_ in traces.items() if a == 0}
    events1 = {r: sum(1 for x in recs_ if x.get("event") == "op") for (r, a), recs_ in recs[1].traces.items()
               if a == 0}
    if events != events1:
        notes.append(f"the two fault-free runs traced different numbers of file events ({events} and {events1}): "
                     "points are numbered by event; those whose event (kind, path, count on it) both runs had "
                     "fire at that event (anchored), the others at their number, and one that lands on another "
                     "event is reported as drifted")
    changes = untraced_after(job, runs[0], {})  # a fault-free run starts from an empty {out}
    untraced = sorted({str(u["file"]) for u in changes if u["size_after"] is not None})
    if changes:
        notes.append(f"{len(changes)} file(s) under {{out}} changed that no traced event explains (a native "
                     "writer the tracer does not see, a child process?): "
                     + "; ".join(f"{u['file']}: {u['how']} ({_size(u['size_before'])} -> {_size(u['size_after'])})"
                                 for u in changes[:5])
                     + ". A point's record names such files; power loss keeps them as they were at the cut")
    native = launch.native_tracer_problem(job, root) or next(  # preloaded, yet a rank could not bind it
        (str(r.get("why")) for recs_ in traces.values() for r in recs_ if r.get("event") == "native_off"), None)
    if native:
        notes.append(f"writes from native code and from processes the job starts are not traced: {native}")
    acks = any(x.get("name") == "chaos.probe" and x.get("info", {}).get("kind") == "saved"
               for recs_ in traces.values() for x in recs_)
    loss_source = losscurve.source(traces)
    losses, losses1 = losscurve.curves(traces, kind=loss_source), losscurve.curves(recs[1].traces, kind=loss_source)
    if losses != losses1:
        tolerance = True
        step = next((s for r in sorted(losses) for s in sorted(losses[r]) if losses1.get(r, {}).get(s) != losses[r][s]),
                    None)
        notes.append(f"the two fault-free runs logged different losses (first at step {step}): tolerance mode, "
                     f"the loss curve judged within {losscurve.band_for(job.loss_band, True):.2%} of the first run's")
    if job.loss_regex and not losses:
        notes.append(f"--loss-regex {job.loss_regex!r} matched no line of the fault-free run's output: "
                     "loss continuity is not judged")
    golden = Golden(out=runs[0].out, results=results, tolerance=tolerance,
                    checkpoints=checkpoint_state(runs[0].out, job.checkpoint_glob) or {}, acks=acks, losses=losses,
                    last_steps=last_steps(traces), loss_source=loss_source)
    notes += durability_notes(job, golden)
    if pre is None:
        pre = preload.choose(job, os.path.join(runs[0].scratch, "trace"), launch.can_prestart(job))
    if pre.note and not pre.zygote_only:  # else said by explore once it knows whether a zygote preloads them
        notes.append(pre.note)
    facts = pointset.gather(job, runs[0].out, runs[0].scratch, kinds, seed)
    facts.stable = pointset.stable_events(recs[1].traces)
    points = pointset.enumerate_points(job, traces, facts, kinds)
    notes += left_out + pointset.notes(job, traces, facts, kinds, points)
    # The same kinds of event in the same order (paths may differ: a temp file's random name is no variation)
    same = [(rk, r["op"]) for rk, r, _, _ in event_keys(traces)] == [(rk, r["op"]) for rk, r, _, _ in
                                                                      event_keys(recs[1].traces)]
    if materialize.job_shape(job) is None and not same:
        notes.append("materialize: the two fault-free runs traced different file events, so one trace cannot "
                     "stand for every run; every point runs to the point")
    return Reference(golden, points, notes, time.monotonic() - started, untraced, events, kinds, bool(netlab),
                     traces, facts, job.nodes, changes, pre.modules, same,
                     job.native_trace and native is None, pre, job.launcher == "docker"), runs[0]


def _size(n: Any) -> str:
    return "absent" if n is None else f"{n} bytes"


def durability_notes(job: JobSpec, golden: Golden) -> list[str]:
    """Where lost work will not be judged at any point, and why (one line each, for the run's summary;
    each point's line says it again). A --checkpoint-glob that matched nothing is refused before
    this (``pointset.check_checkpoint_glob``)."""
    named = job.checkpoint_glob is not None and any(step_of(n) is not None for n in golden.checkpoints)
    if not golden.last_steps and not golden.acks and not named:
        return ["lost work is not judged: no step is known (the job announced none and no --checkpoint-glob "
                "match carries one in its name): give --step-regex or --loss-regex, or call chaos.probe.step / "
                "chaos.probe.saved"]
    return []


@dataclass
class PointResult:
    """One point run and judged; ``to_dict`` is a ``scenarios`` entry of the results JSON."""

    job: JobSpec
    point: Point
    verdict: PointVerdict
    record: PointRecord
    seed: int
    seconds: float

    @property
    def replay(self) -> str:
        return self.job.replay_command(self.point, self.seed)

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        fired = self.record.fired()
        first = [f for f in fired if f.get("attempt") == 0]  # (a second fault's is attempt 1's)
        drift = None
        if first and self.point.kind and first[0].get("op") not in (self.point.kind, "step"):
            drift = f"the fault-free run's event {self.point.op} was {self.point.kind}, this run's {first[0].get('op')}"
        elif first and self.point.anchored and first[0].get("ord") != self.point.op:
            drift = (f"fired at the anchor ({self.point.anchor}), this run's event {first[0].get('ord')}; the "
                     f"fault-free run's was event {self.point.op}: ordinals moved, the event did not")
        then = self.point.then
        second = [f for f in fired if f.get("attempt") == 1 and then is not None and f.get("rank") == then.rank]
        if then is not None and then.kind and second and second[0].get("op") != then.kind:
            drift = ((drift + "; ") if drift else "") + (
                f"the resume's event {then.op} was {then.kind} when it was chosen, this run's {second[0].get('op')}")
        extra = family.families()[self.point.family].recorded(self.job, self.point, self.seed)
        return {
            "id": self.point.id, "seed": self.seed, "checkpointer": "job", "backend": "file",
            "world_size": self.job.world_size, "faults": [self.point.to_fault(**extra)]
            + ([self.point.then.to_fault()] if self.point.then is not None else []), "fired": fired,
            "fault_applied": v.fault,
            "verdict": v.verdict, "outcome": v.outcome, "summary": v.summary,
            "oracles": {n: o.to_dict() for n, o in v.oracles.items()}, "replay": self.replay,
            "error": v.summary if v.verdict == "error" else None, "seconds": round(self.seconds, 3),
            "attempts": [a.to_dict() for a in self.record.attempts], "drift": drift,
            "untraced_changes": self.record.untraced,
            "scenario": {"kind": "job", "job": self.job.to_dict(), "point": self.point.replay_id},
        }


@dataclass
class Exploration:
    reference: Reference
    results: list[PointResult]
    found: int
    chosen: int
    budget_s: float | None
    seconds: float
    job_faults: tuple[str, ...] | None = None  # --faults as given (None: the default)
    interrupted: dict[str, Any] | None = None  # an interrupted run: ``interrupt_record`` (None: it ran to its end)

    @property
    def judged(self) -> list[PointResult]:
        """The points run to their end and judged: every result but those an interrupt cut short."""
        return [r for r in self.results if r.verdict.outcome != INTERRUPTED]

    @property
    def coverage(self) -> float:
        return len(self.first_points) / self.found if self.found else 0.0

    @property
    def first_points(self) -> list[PointResult]:
        """The judged points found in the fault-free run (not those with a second fault in a resume):
        what coverage and the tried kinds count; ``points_tried`` and ``points_chosen`` count all."""
        return [r for r in self.judged if r.point.then is None]

    @property
    def struck_again(self) -> int:
        """How many judged points had a second fault inside their resume (``--resume-points``)."""
        return len(self.judged) - len(self.first_points)

    def to_dict(self) -> dict[str, Any]:
        ref = self.reference
        doc = {"points_found": self.found, "points_chosen": self.chosen, "points_tried": len(self.judged),
               "coverage": round(self.coverage, 4), "budget_s": self.budget_s, "seconds": round(self.seconds, 3),
               "faults": {"asked": list(self.job_faults) if self.job_faults is not None else "all that apply",
                          "explored": list(ref.kinds), "found": pointset.by_kind(ref.points),
                          "tried": pointset.by_kind(r.point for r in self.first_points)},
               "reference": ref.to_dict()}
        if self.struck_again:
            doc["resume_points_tried"] = self.struck_again
        if self.interrupted is not None:
            doc["interrupted"] = self.interrupted
        return doc


def explore(job: JobSpec, *, seed: int = 0, max_points: int | None = None, budget_s: float | None = None,
            jobs: int = 1, only: Point | list[Point] | None = None, scratch_base: str | None = None, keep: bool = False,
            on_reference: Callable[[Reference], None] | None = None,
            on_result: Callable[[PointResult], None] | None = None,
            executor: PointsRunner | None = None, resume_points: int = 0) -> Exploration:
    """The whole exploration in one scratch root (removed afterwards unless ``keep``).

    ``resume_points``: once the chosen points are judged, up to that many more, each a passing
    point with a second fault in its resume (``chaos.plan.resumepoints``), run here.

    ``only``: run exactly these points (``--point``, ``chaos replay``) instead of a sample.
    ``executor``: who runs the chosen points (default :func:`_run_points`, ``jobs`` at a time
    here); ``chaos run --executor slurm`` passes ``slurmexec.SlurmExecutor``, which runs them
    as a Slurm job array over the same scratch root and judges them here, with this golden.

    An interrupt (KeyboardInterrupt: Ctrl-C, or ``launch.Interrupt`` for the SIGTERM that
    ``cli_job`` turns into one) stops every running attempt (``launch.cancel``) and
    starts no other; a point whose chain it cut short is recorded as *interrupted*
    (:func:`interrupted_result`), never judged: a resume SIGKILLed by the harness says
    nothing about the job. Once every copy is gone, every lab torn down and the scratch
    root removed (this function's ``finally``), :class:`Interrupted` carries what was
    done to the caller.
    """
    root = make_root("chaos-job-", scratch_base, keep=keep)
    started = time.monotonic()
    replayed = [] if only is None else only if isinstance(only, list) else [only]
    netlab = True if any(p.family == "net" for p in replayed) and netcut.usable(job)[0] else None
    ref: Reference | None = None
    plan: pointset.Plan | None = None
    chosen: list[Point] = []
    results: list[PointResult] = []
    try:
        try:
            def preloading(choice: Choice) -> JobSpec:
                return dataclasses.replace(job, preload_modules=choice.modules, zygote_preload=choice.zygote_only,
                                           zygote_env=choice.env, import_events=choice.import_events)

            def on_first(choice: Choice) -> None:
                launch.begin_zygote(preloading(choice), root)

            ref, _golden_run = reference(job, root, jobs, seed, netlab, on_first if executor is None else None)
            pre = ref.preload_choice
            job = preloading(pre)  # every attempt from here on
            if executor is None and not zygote.started(root):  # (--jobs 2: both fault-free runs at once)
                launch.begin_zygote(job, root)
            said = launch.zygote_note(job, root) if executor is None else None
            if pre.zygote_only and zygote.serves(root):
                ref.preload = pre.zygote_only  # preloaded after all, in the zygote
            elif pre.zygote_only and pre.note:
                ref.notes.append(pre.note)  # why spares preload nothing (reference left it to here)
            if said is not None:
                ref.notes.append(said)
            # The run order, classes first (every family, each save's end, ...: pointset.plan); what it
            # covers, and what --max-points leaves out, is a note shown with the fault-free runs'.
            plan = (None if only is not None or not ref.points else
                    pointset.plan(ref.points, max_points, seed, pointset.point_classes(job, ref.traces, ref.points)))
            if plan is not None:
                ref.notes += plan.planned_notes(max_points, budget_s)
            if on_reference:
                on_reference(ref)
            if only is not None:  # a replay: exactly these points, in this order
                chosen = [q for p in (only if isinstance(only, list) else [only]) for q in ref.expand(job, p)]
            elif plan is None:
                raise JobError(_no_point(job, ref))
            else:
                chosen = plan.points
            (executor or _run_points)(job, ref, chosen, root, seed, budget_s, jobs, keep, started, results,
                                      on_result)
            if resume_points and only is None:
                second = resumepoints.choose([_resumed(r) for r in results if r.verdict.outcome != INTERRUPTED],
                                             resume_points, seed, power=not job.torchrun)
                ref.notes.append(_second_note(second, resume_points))
                _run_points(job, ref, second, root, seed, budget_s, jobs, keep, started, results, on_result,
                            first=len(chosen))
                chosen = chosen + second
            exploration = _exploration(job, ref, chosen, results, budget_s, started)
            if plan is not None:  # the classes tried, and those the --budget ran out before
                ref.notes += plan.tried_notes([r.point for r in exploration.results], max_points, budget_s)
            return exploration
        except KeyboardInterrupt as exc:
            launch.cancel()  # idempotent: whatever still runs stops now
            signum = launch.signal_of(exc)
            partial = None
            if ref is not None:
                partial = _exploration(job, ref, chosen, results, budget_s, started)
                partial.interrupted = interrupt_record(signum, partial)
                ref.notes.insert(0, interrupted_line(partial.interrupted))
            raise Interrupted(signum, partial) from None
    finally:
        with launch.shield():  # a signal now would leave what this removes: cli_job's handler waits
            launch.kill_all()
            launch.uncancel()
            netcut.teardown_all()  # a run chain's namespaces, if an interrupt cut its own teardown short
            disk.unmount_all(root)  # a full-disk point's tmpfs, if an interrupt cut its own unmount short
            if not keep:
                shutil.rmtree(root, ignore_errors=True)


def _resumed(result: PointResult) -> resumepoints.Resumed:
    """What a judged point's first restart did, for choosing a second fault in it."""
    attempts, traces = result.record.attempts, result.record.traces
    # the first restart: the harness's attempt 1, torchelastic's first restart of the workers (1), or
    # the harness's relaunch of torchrun (TORCHRUN_STRIDE); the chain ended well, and ran it
    first = min((a for (_r, a) in traces if a > 0), default=None)
    resumed = first is not None and attempts[-1].ok and not any(a.materialized for a in attempts[1:])
    durable = result.verdict.oracles.get("durability")
    ranks = durable.evidence.get("ranks", {}) if durable is not None and isinstance(durable.evidence, dict) else {}
    from_checkpoint = any(isinstance(r, dict) and (r.get("resumed_at") or 0) > 0 for r in ranks.values())
    return resumepoints.Resumed(result.point, result.verdict.verdict == "pass", resumed,
                                {rank: recs for (rank, a), recs in traces.items() if a == first}, from_checkpoint)


def _second_note(second: list[Point], asked: int) -> str:
    if not second:
        return (f"--resume-points {asked}: no point passed with a resume to strike (a resume that ran, exited 0 "
                "and made a file event), so no second fault was tried")
    cuts = sum(1 for p in second if p.then is not None and p.then.mode == "power")
    what = f"a kill or ({cuts} of them) a power cut" if cuts else "a kill"
    return (f"--resume-points {asked}: {len(second)} point(s) tried again with {what} inside their resume "
            f"(+rankR:opN: the restart's own event N), then one restart more: {', '.join(p.id for p in second)}")


def _exploration(job: JobSpec, ref: Reference, chosen: list[Point], results: list[PointResult],
                 budget_s: float | None, started: float) -> Exploration:
    """What ``explore`` returns (or an interrupt carries): the results in the order of the points found."""
    order = {p.id: i for i, p in enumerate(ref.points)}
    done = sorted(results, key=lambda r: order.get(r.point.id, len(order)))
    return Exploration(ref, done, len(ref.points), len(chosen), budget_s, time.monotonic() - started, job.faults)


class PointsRunner(Protocol):
    """Runs and judges the chosen points into ``results`` (``on_result`` for each, from any
    thread), never starting one after ``budget_s``; on an interrupt it stops what runs, records
    the points cut short (:func:`interrupted_result`) and lets the interrupt go on. Called once
    by :func:`explore`: :func:`_run_points` here, ``slurmexec.SlurmExecutor`` on a cluster."""

    def __call__(self, job: JobSpec, ref: Reference, chosen: list[Point], root: str, seed: int,
                 budget_s: float | None, jobs: int, keep: bool, started: float, results: list[PointResult],
                 on_result: Callable[[PointResult], None] | None) -> None: ...


def replay_source(job: JobSpec, ref: Reference, point: Point) -> str | None:
    """Where a point's attempt 0 is rebuilt from (materialized: the first fault-free run's
    folder), or None: it runs. Called for each point by :func:`_run_points` and by the Slurm
    executor's plan (``slurmexec``)."""
    if materialize.why_not(job, point, bool(ref.untraced_changes), varies=not ref.same_events) is not None:
        return None
    return os.path.dirname(ref.golden.out)


def _run_points(job: JobSpec, ref: Reference, chosen: list[Point], root: str, seed: int, budget_s: float | None,
                jobs: int, keep: bool, started: float, results: list[PointResult],
                on_result: Callable[[PointResult], None] | None, first: int = 0) -> None:
    """Run and judge ``chosen``, ``jobs`` at a time, into ``results`` (``on_result`` for each);
    their folders are numbered from ``first`` (the points with a second fault follow the others).

    On an interrupt the points not started are cancelled, the running ones stopped
    (``launch.cancel``), and this returns only once their threads are done, each such
    point in ``results`` as interrupted; then the interrupt goes on to ``explore``.
    """
    lock = threading.Lock()
    durations: list[float] = []

    def replay_from(point: Point) -> str | None:
        return replay_source(job, ref, point)

    def estimate() -> float:
        return sum(durations) / len(durations) if durations else ref.seconds

    # Points one at a time leave a core idle: the next attempt's interpreter starts there
    # (launch.prestart, spares.py) while this one runs; not for a net point (its copies start in its lab).
    warm = jobs < (os.cpu_count() or 1) and launch.can_prestart(job)

    def one(i: int, point: Point) -> PointResult | None:
        if budget_s is not None and time.monotonic() - started + estimate() > budget_s:
            return None
        if launch.cancelled():
            return None
        t0 = time.monotonic()
        run = new_run(root, f"point-{first + i:05d}")
        run.prestart = warm and not in_lab(ref.netlab, point) and not point.lost  # (its restart: one rank fewer)
        run.replay_from = replay_from(point)
        if warm and jobs == 1 and i + 1 < len(chosen) and not in_lab(ref.netlab, chosen[i + 1]):
            nxt = new_run(root, f"point-{first + i + 1:05d}")
            if replay_from(chosen[i + 1]) is None:
                launch.prestart(job, nxt.out, nxt.scratch, 0, chosen[i + 1], nxt.mark)
            elif job.max_restarts > 0:  # its first attempt is rebuilt, not run: its restart comes first
                launch.prestart(job, nxt.out, nxt.scratch, 1, chosen[i + 1].then, nxt.mark)
        rec: PointRecord | None = None
        try:
            rec = run_chain(job, run, point, seed, ref.netlab)
        except BaseException:
            if not launch.cancelled():
                raise
            # the interrupt cut the chain short (an attempt not started, a lab torn down under it)
        finally:
            spares.drop(run.scratch)
        if launch.cancelled():  # never judged: what the harness stopped says nothing about the job
            res = interrupted_result(job, point, run, rec, seed, time.monotonic() - t0)
            with lock:
                results.append(res)
            return res
        assert rec is not None
        if point.lost:
            try:
                rec.resized = resized_reference(job, ref, root, rec)
            except BaseException:
                if not launch.cancelled():
                    raise
                rec.resized = "the exploration was interrupted while the fault-free resize ran"
        if launch.cancelled():  # (during the fault-free resize)
            res = interrupted_result(job, point, run, rec, seed, time.monotonic() - t0)
            with lock:
                results.append(res)
            return res
        res = PointResult(job, point, judge(job, ref.golden, rec), rec, seed, time.monotonic() - t0)
        with lock:
            durations.append(res.seconds)
            results.append(res)
            if on_result:
                on_result(res)
        if not keep:
            shutil.rmtree(os.path.join(root, f"point-{first + i:05d}"), ignore_errors=True)
        return res

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: list[cf.Future[PointResult | None]] = []
        try:
            futures += [pool.submit(one, i, p) for i, p in enumerate(chosen)]
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            launch.cancel()  # the running chains stop at their next attempt
            raise  # once the pool's threads are done (its __exit__ waits for them)


INTERRUPTED = "interrupted"  # the outcome of a point an interrupt cut short (verdict "skipped": old readers take it)


def _no_point(job: JobSpec, ref: Reference) -> str:
    """Why a run has no point at all: nothing traced, or nothing the asked families can strike."""
    if not any(ref.events.values()):
        return ("the fault-free run showed no point to break: no file event under {out} was traced and no step "
                "was announced")
    why = [n for n in ref.notes if " not explored" in n]
    asked = f"--faults {','.join(ref.kinds)}" if job.faults is not None else "any fault family that applies here"
    return (f"the fault-free run showed no point to break with {asked} ({sum(ref.events.values())} file event(s) "
            "traced)" + (f": {'; '.join(why)}" if why else ""))


class Interrupted(KeyboardInterrupt):
    """``explore`` was interrupted and has cleaned up: no copy of the job runs, the scratch root is gone.

    ``exploration``: what was done (its ``interrupted`` record says after how many of how
    many points, and which were cut short), None when the fault-free runs had not ended.
    A KeyboardInterrupt, so a caller that knows nothing of it (the pytest plugin) stops as
    on Ctrl-C. ``cli_job`` writes the results of it and exits 128 + ``signum``.
    """

    def __init__(self, signum: int, exploration: Exploration | None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exploration = exploration

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def interrupted_result(job: JobSpec, point: Point, run: Run, rec: PointRecord | None, seed: int,
                       seconds: float) -> PointResult:
    """A point an interrupt cut short, recorded as such: verdict ``skipped`` (what every reader of
    the results schema knows), outcome ``interrupted``, no oracle; its attempts as far as they got."""
    if rec is None:
        rec = PointRecord(point, run.out, run.attempts, {}, None, None)
    ran = "; ".join(f"attempt {a.attempt} {a.describe}" for a in rec.attempts) or "no attempt had started"
    verdict = PointVerdict("skipped", INTERRUPTED, f"interrupted while this point ran ({ran}): not judged; "
                           f"rerun it with --point {point.replay_id}", {})
    return PointResult(job, point, verdict, rec, seed, seconds)


def interrupt_record(signum: int, exploration: Exploration) -> dict[str, Any]:
    """The results JSON's ``job.interrupted``: which signal, after how many judged points of how many chosen,
    and the points it cut short (recorded as interrupted, not judged)."""
    cut = [r.point.id for r in exploration.results if r.verdict.outcome == INTERRUPTED]
    return {"signal": signal.Signals(signum).name, "after": len(exploration.results) - len(cut),
            "of": exploration.chosen, "points": cut}


def interrupted_line(record: dict[str, Any]) -> str:
    """``interrupted after N of M points`` and why: for the console, the notes and every report."""
    line = f"interrupted after {record['after']} of {record['of']} points ({record['signal']})"
    if record.get("points"):
        line += f"; {', '.join(record['points'])} cut short: recorded as interrupted, not judged"
    return line
