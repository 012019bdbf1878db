"""Power-loss exploration: every crash state a save may leave, recovered by the real code.

A SIGKILL leaves what the I/O trace says reached the kernel; a power loss can leave
less (un-fsynced data, un-persisted directory entries). From the recorded trace of
one save (``save(N)`` + ``wait()`` on every rank, with the bytes of every write) and
the tree as it was just before it, :class:`faults.crashstate.CrashModel` lists the
states a POSIX file system may legally be left in. :func:`explore` then, for each
state:

1. materialises it into a scratch directory (two sets of directories per recovery
   group used alternately, on tmpfs where there is one, so the next batch is written
   while the ranks load the previous one; only files that differ from what is there
   are rewritten, see :func:`sync_tree`);
2. runs the checkpointer's own ``load_latest`` in a :class:`~chaos.launch.recovery_pool.RecoveryPool`
   (warm rank processes, real process group), ``batch`` states per round trip;
3. classifies what loaded against the *committed states* (the fingerprints of what
   was handed to every ``save()`` up to N):

   ``ok``          every rank loaded ``committed[s][rank]`` for one ``s``, the same on
                   all ranks, with ``s >= acked_before``; or nothing loaded while
                   nothing had been acknowledged. A state that the *end* of the trace
                   can leave is also what a power loss just after ``wait()`` returned
                   leaves, so there save N itself is acknowledged: ``s >= N``
                   (``after_ack: true`` in a violation says so);
   ``atomicity``   a state that was never committed, ranks on different steps, some
                   ranks with a state and others with none, or a step that names
                   another step's state: a mixture or a partial checkpoint;
   ``durability``  a committed state older than the last acknowledged one, or nothing
                   although a save had been acknowledged (``rejected`` quotes why each
                   rank passed over the newer steps, where the checkpointer announces it
                   with phase ``load_rejected``, as the reference does);
   ``error``       ``load_latest`` raised (the text is kept). Everything in the tree
                   before save N is taken as durable, so when a save had been
                   acknowledged its checkpoint was there to load: ``liveness: true``;
   ``hang``        a collective timed out or a rank did not answer (the pool restarts).

Only distinct trees are recovered: combinations of crash point and choices that leave
byte-identical trees (the same fingerprint, :meth:`CrashModel.fingerprint_choice`) share
one recovery, and are reported as *pruned*, never as checked (``states_generated`` =
``states_checked`` + ``states_pruned``), each judged from that recovery against its own
crash point's acknowledgement (``pruned_counts``).

Every class but ``ok`` is a violation. Short traces are enumerated exhaustively,
long ones sampled with a seed; the report says which, with the counts. Sampling
draws from the *covering* crash points only (just before each fsync, and the end:
:func:`covering_prefixes` explains why their states include all others), so a save
of 100 writes and 2 renames does not spend 98% of its draws inside the writes;
``mode="power-uniform"`` keeps the crash model's own uniform sampler.

``mode="kill"`` checks only the states a process kill can leave (after each op,
everything issued persisted): the same classification, the control experiment that
shows a checkpointer without fsync passing an ordinary kill.

:func:`record_save` produces a :class:`PowerLossInput` from a real multi-rank run
(tests, ``chaos bench crashstates``)::

    inp = record_save("/dev/shm/x/ckpt", "/dev/shm/x/rec",
                      checkpointer="tests/checkpointers/careful.py:CarefulCheckpointer")
    report = explore(inp)
    print(report.checked, report.states_per_s, report.counts)
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from chaos.errors import HarnessError
from chaos.launch.recovery_pool import RecoveryPool
from chaos.scratch import make_root
from faults.crashstate import CrashModel, CrashSet, CrashState, Deduper, Snapshot, merge_traces

CLASSES = ("ok", "atomicity", "durability", "error", "hang")
MODES = ("power", "power-uniform", "kill")

# A small workload: its template and shards are cheap to load and hash, which is
# what makes dozens of states per second possible.
SMALL_WORKLOAD: dict[str, Any] = {
    "d_model": 64, "n_layers": 1, "n_heads": 2, "vocab": 128, "seq_len": 16, "batch_size": 2,
    "corpus_sequences": 64, "save_every": 0, "warmup_steps": 1, "collective_timeout_s": 30.0,
}


def scratch_root() -> str:
    """Where crash states are written: tmpfs (``/dev/shm``) when present, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@dataclass
class PowerLossInput:
    """One recorded save and what may legitimately be found after it.

    ``ckpt_root``: the live root the trace was recorded under (paths in the trace are
    relative to it). ``base``: the tree captured with every rank paused just before
    ``save(step)``. ``traces``: per rank, its trace records with data
    (``read_trace(path, with_data=True)``), covering the save and its ``wait()``.
    ``committed``: step -> rank -> fingerprint of the state handed to ``save`` for every
    save up to ``step``. ``acked_before``: newest step acknowledged before the save
    began (None: none). ``max_states``: sample size when the total exceeds
    ``exhaustive_limit``. ``scratch``: where states are materialised (None: a fresh
    directory under :func:`scratch_root`, removed afterwards). ``mode``: see
    :func:`plan_states`. ``parallel``: recovery groups run at once (see :func:`explore`).
    ``batch``: states sent to a group per round trip (1: one at a time).
    """

    ckpt_root: str
    base: Snapshot
    traces: list[list[dict[str, Any]]]
    checkpointer: str
    world_size: int
    workload: dict[str, Any]
    step: int
    committed: dict[int, dict[int, dict[str, str]]]
    acked_before: int | None
    ckpt_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    max_states: int = 400
    exhaustive_limit: int = 16384
    scratch: str | None = None
    mode: str = "power"
    parallel: int = 1
    batch: int = 8


@dataclass
class PowerLossReport:
    """What was explored and what was found (``to_dict()`` is JSON-ready).

    The state counts, kept apart: ``states_generated`` distinct combinations of crash
    point and choices (each a crash state of the model); ``states_distinct`` distinct
    trees among them (byte-identical contents, by fingerprint); ``states_checked`` trees
    recovered by the real checkpointer and judged (``checked``, ``counts``); and
    ``states_pruned`` = generated - checked, states whose tree is byte-identical to a
    checked one and which share its recovery (never counted as checked). ``pruned_counts``
    classifies them from that shared recovery, each against its own crash point's
    acknowledgement. ``generated`` is the distinct count (its meaning before pruning was
    counted). Rates: ``checked_per_s`` = checked / ``seconds`` (the recovery phase: what
    ``states_per_s`` measured before); ``states_per_s`` = (checked + pruned) /
    ``total_seconds`` (planning included).
    """

    checkpointer: str
    step: int
    acked_before: int | None
    mode: str
    world_size: int
    total_possible: int
    generated: int
    checked: int
    exhaustive: bool
    seed: int
    sampling: str
    prefixes: int
    trace_ops: int
    seconds: float
    generate_seconds: float
    states_per_s: float
    counts: dict[str, int]
    violations: list[dict[str, Any]]
    pool: dict[str, Any]
    cpu: dict[str, Any] = field(default_factory=dict)
    states_generated: int = 0
    states_distinct: int = 0
    states_checked: int = 0
    states_pruned: int = 0
    pruned_counts: dict[str, int] = field(default_factory=dict)
    checked_per_s: float = 0.0
    total_seconds: float = 0.0

    @property
    def violation_count(self) -> int:
        return sum(n for c, n in self.counts.items() if c != "ok")

    @property
    def passed(self) -> bool:
        return self.violation_count == 0

    def to_dict(self, max_violations: int = 200) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["violations"] = self.violations[:max_violations]
        d["violations_left_off"] = max(0, len(self.violations) - max_violations)
        d["violation_count"] = self.violation_count
        d["passed"] = self.passed
        return d

    def summary(self) -> str:
        how = "exhaustive" if self.exhaustive else f"sampled, seed {self.seed}"
        counts = " ".join(f"{c}={self.counts[c]}" for c in CLASSES)
        return (f"{self.mode} crash states of save {self.step}: checked {self.checked} of "
                f"{self.generated} distinct ({self.states_generated} states generated, {self.states_pruned} "
                f"pruned as byte-identical to a checked one; {self.total_possible} combinations, {how}) in "
                f"{self.total_seconds:.1f} s = {self.states_per_s:.1f} states/s, "
                f"{self.checked_per_s:.1f} checked/s; {counts}")


# ---------------------------------------------------------------------- classification
def _norm_committed(committed: Mapping[Any, Mapping[Any, Mapping[str, str]]]) -> dict[int, dict[int, dict[str, str]]]:
    """Steps and ranks as ints (a committed map read back from JSON has string keys)."""
    return {int(s): {int(r): dict(fp) for r, fp in by_rank.items()} for s, by_rank in committed.items()}


def _nearest_difference(committed: dict[int, dict[int, dict[str, str]]], rank: int,
                        step: int | None, fp: Mapping[str, str]) -> str | None:
    from chaos.model.statehash import first_difference

    if step is not None and step in committed and rank in committed[step]:
        return first_difference(committed[step][rank], fp)
    cands = [s for s in committed if rank in committed[s]]
    if not cands:
        return "no committed state to compare with"
    best = min(cands, key=lambda s: sum(1 for k in set(fp) | set(committed[s][rank])
                                         if fp.get(k) != committed[s][rank].get(k)))
    return f"vs step {best}: {first_difference(committed[best][rank], fp)}"


def classify(results: list[dict[str, Any]], committed: Mapping[Any, Mapping[Any, Mapping[str, str]]],
             acked_before: int | None) -> tuple[str, dict[str, Any]]:
    """Class of one recovery (see the module docstring) and the evidence for it."""
    com = _norm_committed(committed)
    steps = [r.get("step") for r in results]
    detail: dict[str, Any] = {"loaded_step": steps}
    if any(r.get("timeout") for r in results):
        detail["error"] = next(r["error"] for r in results if r.get("timeout"))
        return "hang", detail
    errors = [f"rank {r['rank']}: {r['error']}" for r in results if r.get("error")]
    if errors:
        detail["error"] = "; ".join(errors)
        detail["liveness"] = acked_before is not None
        return "error", detail
    if all(s is None for s in steps):
        if acked_before is None:
            return "ok", detail
        detail["reason"] = f"nothing loaded although step {acked_before} was acknowledged"
        return "durability", detail
    if any(s is None for s in steps):
        detail["reason"] = "some ranks loaded a checkpoint, others none"
        return "atomicity", detail
    # Which committed steps does each rank's state equal?
    matches: list[set[int]] = []
    for r in results:
        fp = r["fingerprint"] or {}
        matches.append({s for s, by_rank in com.items() if by_rank.get(r["rank"]) == fp})
    for r, m in zip(results, matches, strict=True):
        if not m:
            detail["reason"] = f"rank {r['rank']} loaded a state that was never committed"
            detail["first_difference"] = _nearest_difference(com, r["rank"], r["step"], r["fingerprint"] or {})
            return "atomicity", detail
    common = set.intersection(*matches)
    if len(set(steps)) > 1 or not common:
        detail["reason"] = (f"ranks loaded different checkpoints: steps {steps}, states of "
                            f"{[sorted(m) for m in matches]}")
        return "atomicity", detail
    if steps[0] not in common:
        detail["reason"] = f"load_latest said step {steps[0]} but the state is step {sorted(common)}"
        return "atomicity", detail
    if acked_before is not None and steps[0] < acked_before:
        detail["reason"] = f"loaded step {steps[0]}, older than acknowledged step {acked_before}"
        why = {f"rank {r['rank']}": r["rejected"] for r in results if r.get("rejected")}
        if why:  # the checkpointer said why it passed over the newer steps
            detail["rejected"] = why
        return "durability", detail
    return "ok", detail


# ---------------------------------------------------------------------- exploration
def _kill_states(model: CrashModel) -> CrashSet:
    """After each op, everything issued persisted: the states a process kill leaves."""
    dedup = Deduper(model)
    for k in reversed(range(model.n_prefixes)):
        dedup.add(k, {}, {}, unique=True)  # no choice given = every pending item persisted
    out = dedup.states()
    return CrashSet(out, model.n_prefixes, len(out), True, model.seed,
                    "process kill after every op (all issued I/O persisted)", model.n_prefixes,
                    dedup.enumerated, dedup.end_equivalents())


def covering_prefixes(model: CrashModel) -> list[int]:
    """Crash points whose states include those of every other crash point.

    Between two fsyncs the trace only *adds* pending work (writes, creates, renames,
    unlinks), and what survives is a prefix of each pending list; so every state of a
    crash point is also a state of the last crash point before the next fsync (choose
    to persist only what had been issued). Only an fsync shrinks the choices. The
    covering points are therefore "just before each fsync" and "at the end": checking
    all their states checks all states, with far fewer draws wasted on crash points
    inside a long run of writes, which is where a uniform sample spends most of them.
    """
    n = len(model.ops)
    return [k for k in range(model.n_prefixes)
            if k == n or model.ops[k].get("op") in ("fsync", "fdatasync")]


def _covering_set(model: CrashModel, seed: int, exhaustive_limit: int, samples: int) -> CrashSet:
    """Like ``CrashModel.generate`` but over :func:`covering_prefixes` only.

    Uses the model's per-prefix enumerators (``all_choices``, ``extreme_choices``,
    ``random_choice``) and keeps, of the combinations leaving one tree, the latest crash
    point: it names the most that was lost, and a state the end can leave is judged as
    after the ack. ``total_possible`` still counts every crash point's combinations.
    """
    ks = covering_prefixes(model)
    total_all = sum(model.count(k) for k in range(model.n_prefixes))
    covering_total = sum(model.count(k) for k in ks)
    dedup = Deduper(model, latest=True)
    if covering_total <= exhaustive_limit:
        for k in reversed(ks):
            for ch in model.all_choices(k):
                dedup.add(k, *ch, unique=True)
        exhaustive, how = True, (f"exhaustive over the {len(ks)} covering crash points "
                                 f"(before each fsync and at the end; {covering_total} combinations)")
    else:
        rng = random.Random(seed)
        for k in reversed(ks):
            for ch in model.extreme_choices(k):
                if len(dedup) < samples:
                    dedup.add(k, *ch)
        attempts = samples * 20
        while len(dedup) < samples and attempts > 0:
            attempts -= 1
            k = rng.choice(ks)
            dedup.add(k, *model.random_choice(k, rng))
        exhaustive, how = False, (f"seeded sample (seed {seed}) of the {len(ks)} covering crash points "
                                  f"(before each fsync and at the end; {covering_total} combinations): "
                                  f"all-lost and all-persisted of each, then uniform point and choices, "
                                  f"{samples} wanted")
    out = dedup.states()
    return CrashSet(out, total_all, len(out), exhaustive, seed, how, model.n_prefixes, dedup.enumerated,
                    dedup.end_equivalents())


def plan_states(inp: PowerLossInput) -> tuple[CrashModel, CrashSet]:
    """The crash model of the input's save and the states :func:`explore` would check.

    ``mode="power"`` samples the covering crash points (see :func:`covering_prefixes`);
    ``"power-uniform"`` uses ``CrashModel.generate`` as is (every crash point alike);
    ``"kill"`` takes one state per crash point, everything issued persisted.
    """
    if inp.mode not in MODES:
        raise HarnessError(f"unknown crash mode {inp.mode!r}; expected one of {MODES}")
    model = CrashModel(inp.ckpt_root, inp.base, merge_traces(inp.traces), seed=inp.seed)
    if inp.mode == "kill":
        return model, _kill_states(model)
    if inp.mode == "power-uniform":
        return model, model.generate(seed=inp.seed, exhaustive_limit=inp.exhaustive_limit,
                                     samples=inp.max_states)
    return model, _covering_set(model, inp.seed, inp.exhaustive_limit, inp.max_states)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def sync_tree(model: CrashModel, st: CrashState, dest: str) -> int:
    """Make ``dest`` hold exactly ``st``'s tree, rewriting only what differs; bytes written.

    Consecutive crash states share most files (the older checkpoint, fsynced shards),
    and writing them to tmpfs again is most of a state's cost in the parent. Whatever
    the previous recovery did to the directory (deleted stale files, wrote metrics,
    even rewrote a shard in place) is undone: every kept file of the right size is *read
    back and compared* byte for byte, never trusted from a size or a timestamp (a size
    that differs is rewritten without reading), and anything not in the state is
    removed. The result equals ``model.materialize`` into an empty directory.
    """
    dirs, files = model.contents(st)
    want_dirs = set(dirs)
    written = 0
    sizes: dict[str, int] = {}
    # Top-down: drop what the state does not have (or has as the other kind).
    stack = [""]
    while stack:
        rel = stack.pop()
        base = os.path.join(dest, rel) if rel else dest
        with os.scandir(base) as it:
            entries = list(it)
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            if e.is_dir(follow_symlinks=False):
                if r in want_dirs:
                    stack.append(r)
                else:
                    shutil.rmtree(e.path)
            elif r not in files or e.is_symlink() or not e.is_file(follow_symlinks=False):
                _remove(e.path)
            else:
                sizes[r] = e.stat(follow_symlinks=False).st_size
    for d in dirs:
        p = os.path.join(dest, d)
        if not os.path.isdir(p):
            os.mkdir(p)
    for rel, data in files.items():
        p = os.path.join(dest, rel)
        if sizes.get(rel) != len(data) or _read(p) != data:
            _write(p, data)
            written += len(data)
    return written


class _Judge:
    """Verdicts of one exploration: checked states by class, pruned ones by class.

    A checked state is judged against its own crash point's acknowledgement (a state the
    end of the trace can leave is what a power loss just after ``wait()`` leaves: save N
    is acknowledged). The combinations pruned into it share its recovery and are judged
    from it against theirs: after the ack for those at the end, ``acked_before`` for the
    rest (a cheap comparison in the parent, cached per acknowledgement).
    """

    def __init__(self, inp: PowerLossInput, cs: CrashSet, end: int) -> None:
        self.inp, self.cs, self.end = inp, cs, end
        self.counts = dict.fromkeys(CLASSES, 0)
        self.pruned = dict.fromkeys(CLASSES, 0)
        self.violations: list[dict[str, Any]] = []

    def settle(self, st: CrashState, results: list[dict[str, Any]]) -> None:
        inp = self.inp
        after_ack = st.prefix == self.end
        acked = inp.step if after_ack else inp.acked_before
        cls, detail = classify(results, inp.committed, acked)
        if after_ack:
            detail["after_ack"] = True
        self.counts[cls] += 1
        if cls != "ok":
            self.violations.append({"id": st.id, "class": cls, "prefix": st.prefix,
                                    "after_seq": st.after_seq, "lost": st.lost,
                                    "equivalents": st.equivalents, **detail})
        at_end = self.cs.end_equivalents.get(st.id, 0) - (1 if after_ack else 0)
        before = st.equivalents - 1 - at_end
        for n, ack, same in ((at_end, inp.step, after_ack), (before, inp.acked_before, not after_ack)):
            if n > 0:
                self.pruned[cls if same else classify(results, inp.committed, ack)[0]] += n


def explore(inp: PowerLossInput,
            pool: RecoveryPool | list[RecoveryPool] | None = None) -> PowerLossReport:
    """Check every planned crash state of ``inp``'s save by running the real recovery.

    ``pool``: warm pool(s) for this checkpointer and workload to reuse (kept open);
    without, ``inp.parallel`` pools are started for the call and closed after it.
    With several pools, that many states are recovered at once: a recovery spends
    part of its time with one rank waiting for the other in a collective, and a
    second group fills those gaps (it cannot beat the CPU cost, reported in ``cpu``).

    States go to a pool ``inp.batch`` at a time (one round trip per batch); while a
    pool recovers one batch, the parent writes the next into that pool's other set of
    directories (:func:`sync_tree`: only what differs from the state last there).
    Only distinct trees are recovered: :func:`plan_states` keeps one state per tree and
    counts the combinations it stands for, which are reported as pruned.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    model, cs = plan_states(inp)
    gen_s, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
    own_scratch = inp.scratch is None
    scratch = inp.scratch or make_root("chaos-powerloss-", scratch_root())
    own_pool = pool is None
    pools: list[RecoveryPool] = [] if pool is None else (list(pool) if isinstance(pool, list) else [pool])
    n_pools = max(1, inp.parallel) if own_pool else len(pools)
    batch = max(1, inp.batch)
    # Two sets of directories per pool: one being loaded, the next one being written.
    slots = [[[os.path.join(scratch, f"p{p}{x}{j}") for j in range(batch)] for x in "ab"] for p in range(n_pools)]
    for pair in slots:
        for group in pair:
            for d in group:
                os.makedirs(d, exist_ok=True)
    judge = _Judge(inp, cs, model.n_prefixes - 1)
    try:
        if own_pool:
            for _ in range(n_pools):
                pools.append(RecoveryPool(inp.world_size, inp.workload, inp.checkpointer, inp.ckpt_options))
        starts0 = [0 if own_pool else p.stats.starts for p in pools]
        restarts0 = [len(p.stats.restarts) for p in pools]
        t1 = time.perf_counter()
        cpu0, wcpu0 = time.process_time(), sum(p.cpu_seconds() for p in pools)
        todo = list(reversed(cs.states))  # popped from the end: in plan order
        flight: list[list[CrashState] | None] = [None] * n_pools
        ready: list[list[CrashState]] = [[] for _ in range(n_pools)]
        side = [0] * n_pools

        def prepare(p: int) -> None:
            # Written into the set the pool is not reading (the one its last batch did not use).
            out: list[CrashState] = []
            while todo and len(out) < batch:
                st = todo.pop()
                sync_tree(model, st, slots[p][side[p]][len(out)])
                out.append(st)
            ready[p] = out

        def launch(p: int) -> None:
            if ready[p]:
                pools[p].submit_batch(slots[p][side[p]][:len(ready[p])])
                flight[p], ready[p] = ready[p], []
                side[p] ^= 1
                prepare(p)

        for p in range(n_pools):
            prepare(p)
            launch(p)
        while any(f is not None for f in flight):
            done = [p for p, f in enumerate(flight) if f is not None and pools[p].poll_batch()]
            if not done:
                wait([x for p, f in enumerate(flight) if f is not None for x in pools[p].waitables()], timeout=1.0)
                continue
            for p in done:
                sent, flight[p] = flight[p], None
                assert sent is not None
                again: list[CrashState] = []
                for st, res in zip(sent, pools[p].collect_batch(), strict=True):
                    if res is None:
                        again.append(st)  # the group ended the batch early: rewritten and sent again
                    else:
                        judge.settle(st, res)
                if again:
                    todo.extend(reversed(again))
                    if not ready[p]:
                        prepare(p)
                launch(p)
                for q in range(n_pools):  # a pool left idle by an empty queue gets the states sent again
                    if flight[q] is None and todo:
                        if not ready[q]:
                            prepare(q)
                        launch(q)
        seconds = time.perf_counter() - t1
        counts, violations = judge.counts, sorted(judge.violations, key=lambda v: (v["prefix"], v["id"]))
        checked = sum(counts.values())
        pcpu, wcpu = time.process_time() - cpu0, sum(p.cpu_seconds() for p in pools) - wcpu0
        states = cs.enumerated or checked
        cpu = {"parent_s": round(pcpu, 3), "workers_s": round(wcpu, 3), "generate_s": round(gen_cpu, 3),
               "per_state_ms": round((pcpu + wcpu) / checked * 1e3, 2) if checked else None,
               "capacity_states_per_s_2_cores": round(2 * checked / (pcpu + wcpu), 1) if pcpu + wcpu > 0 else None,
               "per_generated_state_ms": round((pcpu + wcpu + gen_cpu) / states * 1e3, 3) if states else None,
               "capacity_generated_per_s_2_cores": (round(2 * states / (pcpu + wcpu + gen_cpu), 1)
                                                    if pcpu + wcpu + gen_cpu > 0 else None),
               "load_avg_1m": round(os.getloadavg()[0], 2)}
        pool_info = {"own_pool": own_pool, "pools": n_pools, "batch": batch,
                     "starts": sum(p.stats.starts - s0 for p, s0 in zip(pools, starts0, strict=True)),
                     "restarts": [r for p, r0 in zip(pools, restarts0, strict=True) for r in p.stats.restarts[r0:]],
                     "start_seconds": round(max(p.stats.start_seconds for p in pools), 3)}
    finally:
        if own_pool:
            for p in pools:
                p.close()
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            for pair in slots:
                for group in pair:
                    for d in group:
                        shutil.rmtree(d, ignore_errors=True)
    pruned = states - cs.generated  # combinations whose tree is byte-identical to a kept state's
    total_s = gen_s + seconds
    return PowerLossReport(
        checkpointer=inp.checkpointer, step=inp.step, acked_before=inp.acked_before, mode=inp.mode,
        world_size=inp.world_size, total_possible=cs.total_possible, generated=cs.generated,
        checked=checked, exhaustive=cs.exhaustive, seed=cs.seed, sampling=cs.sampling,
        prefixes=cs.prefixes, trace_ops=len(model.ops), seconds=round(seconds, 3),
        generate_seconds=round(gen_s, 3),
        states_per_s=round(states / total_s, 1) if total_s > 0 else 0.0,
        counts=counts, violations=violations, pool=pool_info, cpu=cpu,
        states_generated=states, states_distinct=cs.generated, states_checked=checked, states_pruned=pruned,
        pruned_counts=judge.pruned, checked_per_s=round(checked / seconds, 1) if seconds > 0 else 0.0,
        total_seconds=round(total_s, 3))


# ---------------------------------------------------------------------- recording
@dataclass(frozen=True)
class _RecordSpec:
    rank: int
    world_size: int
    port: int
    workload: dict[str, Any]
    checkpointer: str
    ckpt_options: dict[str, Any]
    ckpt_root: str
    trace_path: str
    saves: tuple[int, ...]


def _record_rank(spec: _RecordSpec, conn: Any) -> None:
    """One rank of a recording: train, save, pause before the last save, save it traced."""
    from chaos.launch.recovery_pool import _err
    from chaos.target.workload.train import become_rank_process

    become_rank_process()
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from chaos.model.statehash import fingerprint
        from chaos.target.protocol import load_checkpointer
        from chaos.target.workload.config import WorkloadConfig
        from chaos.target.workload.train import Trainer
        from faults.interposer import Interposer

        torch.set_num_threads(1)
        cfg = WorkloadConfig.from_dict(spec.workload)
        timeout = timedelta(seconds=cfg.collective_timeout_s)
        store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=spec.rank == 0,
                              timeout=timeout, wait_for_workers=False)
        if spec.rank == 0:
            conn.send(("store_ready",))
        dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.world_size,
                                timeout=timeout)
        trainer = Trainer(cfg, spec.rank, spec.world_size)
        ckpt = load_checkpointer(spec.checkpointer)(spec.ckpt_root, spec.rank, spec.world_size,
                                                    **spec.ckpt_options)
        committed: dict[int, dict[str, str]] = {}
        acked: int | None = None
        *before, last = spec.saves
        for s in before:
            while trainer.step < s:
                trainer.train_step()
            state = trainer.state_dict()
            committed[s] = fingerprint(state)
            ckpt.save(s, state)
            ckpt.wait()
            acked = s
        while trainer.step < last:
            trainer.train_step()
        state = trainer.state_dict()
        committed[last] = fingerprint(state)
        dist.barrier()
        conn.send(("paused",))
        if conn.recv()[0] != "go":
            os._exit(5)
        with Interposer(spec.ckpt_root, spec.rank, spec.trace_path):
            ckpt.save(last, state)
            ckpt.wait()
        dist.barrier()
        ckpt.close()
        conn.send(("done", committed, acked))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - the parent raises with this text
        import traceback

        try:
            conn.send(("failed", _err(exc) + "\n" + traceback.format_exc()[-2000:]))
        finally:
            os._exit(3)
    os._exit(0)


def record_save(ckpt_root: str | os.PathLike[str], work_dir: str | os.PathLike[str], *,
                checkpointer: str, ckpt_options: dict[str, Any] | None = None,
                world_size: int = 2, workload: dict[str, Any] | None = None,
                saves: tuple[int, ...] = (1, 2), seed: int = 0, max_states: int = 400,
                exhaustive_limit: int = 16384, timeout_s: float = 120.0) -> PowerLossInput:
    """Run ``world_size`` real ranks that save at ``saves`` and record the last save.

    Every save before the last is waited for (so ``acked_before`` is the one before
    the last). With every rank paused at a barrier just before the last save, the
    parent captures the tree (:class:`Snapshot`); each rank then performs the save and
    its ``wait()`` under an :class:`~faults.interposer.Interposer` writing
    ``work_dir/trace-rank<r>.jsonl`` with full data. Returns the input for
    :func:`explore` (``mode``, ``scratch``... can be changed with ``dataclasses.replace``).
    """
    from chaos.launch.ports import free_port
    from chaos.launch.reaper import kill_rank
    from chaos.launch.recovery_pool import _context
    from chaos.target.protocol import validate_spec
    from faults.interposer import read_trace

    if not saves or list(saves) != sorted(set(saves)) or saves[0] < 1:
        raise HarnessError(f"saves must be increasing steps >= 1, got {saves}")
    spec_name = validate_spec(checkpointer)
    root = os.path.realpath(os.fspath(ckpt_root))
    work = os.fspath(work_dir)
    os.makedirs(root, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    wl = {**SMALL_WORKLOAD, **(workload or {})}
    wl["steps"] = max(int(wl.get("steps", 0) or 0), saves[-1])
    opts = dict(ckpt_options or {})
    ctx = _context()
    port = free_port()
    procs: list[Any] = []
    conns: list[Any] = []
    deadline = time.monotonic() + timeout_s

    def recv(rank: int, what: str) -> tuple[Any, ...]:
        from multiprocessing.connection import wait

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError(f"recording rank {rank} did not reach {what!r} in {timeout_s:.0f} s")
            if not wait([conns[rank], procs[rank].sentinel], timeout=left):
                continue
            if conns[rank].poll():
                try:
                    msg = conns[rank].recv()
                except (EOFError, OSError):
                    procs[rank].join(timeout=5)
                    raise HarnessError(f"recording rank {rank} exited with {procs[rank].exitcode} "
                                       f"before {what!r}") from None
                if msg[0] == "failed":
                    raise HarnessError(f"recording rank {rank} failed: {msg[1]}")
                if msg[0] == what:
                    return msg
            elif not procs[rank].is_alive():
                raise HarnessError(f"recording rank {rank} exited with {procs[rank].exitcode} before {what!r}")

    def start(rank: int) -> None:
        parent, child = ctx.Pipe()
        rs = _RecordSpec(rank, world_size, port, wl, spec_name, opts, root,
                         os.path.join(os.path.abspath(work), f"trace-rank{rank}.jsonl"), tuple(saves))
        p = ctx.Process(target=_record_rank, args=(rs, child), daemon=False, name=f"chaos-record-{rank}")
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)

    try:
        for r in range(world_size):
            tp = os.path.join(os.path.abspath(work), f"trace-rank{r}.jsonl")
            for f in (tp, tp + ".data"):
                if os.path.exists(f):
                    os.unlink(f)
        start(0)
        recv(0, "store_ready")
        for r in range(1, world_size):
            start(r)
        for r in range(world_size):
            recv(r, "paused")
        base = Snapshot.capture(root)
        for c in conns:
            c.send(("go",))
        committed: dict[int, dict[int, dict[str, str]]] = {}
        acked: int | None = None
        for r in range(world_size):
            _, by_step, acked = recv(r, "done")
            for s, fp in by_step.items():
                committed.setdefault(int(s), {})[r] = fp
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                kill_rank(p.pid)
            p.join(timeout=10)
        for c in conns:
            c.close()
    traces = [read_trace(os.path.join(work, f"trace-rank{r}.jsonl"), with_data=True)
              for r in range(world_size)]
    return PowerLossInput(ckpt_root=root, base=base, traces=traces, checkpointer=spec_name,
                          world_size=world_size, workload=wl, step=saves[-1], committed=committed,
                          acked_before=acked, ckpt_options=opts, seed=seed, max_states=max_states,
                          exhaustive_limit=exhaustive_limit)


__all__ = ["CLASSES", "MODES", "SMALL_WORKLOAD", "PowerLossInput", "PowerLossReport", "classify",
           "explore", "plan_states", "record_save", "scratch_root"]
