"""Run one scenario end to end: golden, faulted run, record, oracles, verdict.

Every scenario gets a fresh scratch root that is removed afterwards (unless kept on
request), on success, failure, timeout and Ctrl-C alike.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, ConfigError
from chaos.judge.oracles import judge
from chaos.launch import cluster, reaper
from chaos.launch.drivers import open_driver
from chaos.model.check import Check
from chaos.nemesis.environment import Environment, idle_faults
from chaos.plan.scenario import Scenario
from chaos.record.golden import GoldenRun, ResizedReference, get_golden, get_resized_references
from chaos.record.history import RunRecord, read_events
from chaos.scratch import make_root
from chaos.target.protocol import validate_spec
from faults import Unsupported


@dataclass
class RunOptions:
    scratch_base: str | None = None
    keep: bool = False
    cache_dir: Path | None = None
    use_golden_cache: bool = True
    hang_timeout_s: float = 60.0
    attempt_timeout_s: float = 900.0


@dataclass
class ScenarioResult:
    scenario: Scenario
    verdict: str  # pass | fail | error | skipped
    oracles: dict[str, Check] = field(default_factory=dict)
    record: RunRecord | None = None
    golden: GoldenRun | None = None
    error: str | None = None
    seconds: float = 0.0
    golden_cached: bool = False
    scratch: str | None = None
    # Where the harness's own time went: (name, start, end) in time.time(), in order, for
    # ``chaos bench launch`` (which lines them up with the ranks' events). Not in to_dict.
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def replay(self) -> str:
        return self.scenario.replay_command()

    def failing(self) -> list[Check]:
        return [o for o in self.oracles.values() if not o.passed]

    def to_dict(self) -> dict[str, Any]:
        s = self.scenario
        return {
            "id": s.id, "seed": s.workload.seed, "checkpointer": s.checkpointer, "backend": s.backend,
            "world_size": s.world_size, "faults": [f.to_dict() for f in s.faults],
            "fired": self.record.fired_faults() if self.record else [],
            "verdict": self.verdict, "oracles": {n: o.to_dict() for n, o in self.oracles.items()},
            "replay": self.replay, "error": self.error, "seconds": round(self.seconds, 3),
            "golden_cached": self.golden_cached, "scenario": s.to_dict(),
            "attempts": self.record.attempts if self.record else [],
            "losses": {str(r): self.record.losses(r) for r in range(s.world_size)} if self.record else {},
            "golden_losses": {str(r): c for r, c in self.golden.curves.items()} if self.golden else {},
            "timeline": self.record.timeline() if self.record else [],
            "io": self.record.io if self.record else {},
        }


def _verdict(oracles: dict[str, Check]) -> str:
    return "pass" if all(o.passed for o in oracles.values()) else "fail"


def _verify_record(verify: cluster.AttemptResult, log_dir: str, world_size: int) -> dict[str, Any]:
    events = {r: read_events(cluster.log_path(log_dir, r, cluster.VERIFY)) for r in range(world_size)}
    errors = [e for evs in events.values() for e in evs if e["ev"] == "error"]
    return {"outcome": verify.outcome, "detail": verify.detail, "events": events,
            "errors": [{"rank": e["rank"], "type": e["type"], "message": e["message"][:500]} for e in errors]}


def _leftovers(record: RunRecord, scratch: Path, suffix: str | None) -> dict[str, list]:
    """Everything of this scenario that should be gone by now: rank processes, mounts, namespaces.

    Called after the harness's own teardown (each attempt kills its ranks' process
    groups, the environment unmounts and removes its namespaces) and *before* the
    runner's last-resort clean-up, so what it finds really outlived the scenario: a
    rank that did not die, or a helper that left the rank's process group (a daemon, a
    ``setsid`` child), found by the ``CHAOS_SCENARIO`` mark every descendant inherits.
    """
    from chaos.target.workload.spec import SCENARIO_ENV
    from faults.disk import mounts_under
    from faults.process import alive, marked_with

    pids = {e["pid"] for a in record.events.values() for evs in a.values() for e in evs if e["ev"] == "start"}
    pids |= {e["pid"] for evs in record.verify.get("events", {}).values() for e in evs if e["ev"] == "start"}
    live = {p for p in pids if alive(p)} | set(marked_with(SCENARIO_ENV, str(scratch)))
    out: dict[str, list] = {"processes": sorted(live), "mounts": mounts_under(scratch)}
    if suffix is not None:
        from faults.network import leftovers

        out["network"] = leftovers(suffix)
    return out


def _clean_leftovers(found: dict[str, list], scratch: Path) -> None:
    """The last resort, after hygiene has looked: no process of the scenario survives it.

    Only this scenario's (``scratch``): in a pipelined campaign the next scenario's ranks
    run while this one is judged.
    """
    reaper.kill_all(scope=str(scratch))
    reaper.kill_pids(found.get("processes", []))


def _save_trace(log_dir: str, rank: int, attempt: int, mark: int, step: int) -> list[dict[str, Any]]:
    """Rank's trace records of the save at ``step`` (and its wait), up to the next save's announcement."""
    from faults.interposer import read_trace

    out = []
    for rec in read_trace(cluster.trace_path(log_dir, rank, attempt), with_data=True)[mark:]:
        info = rec.get("info") or {}
        if rec.get("event") == "phase" and rec.get("name") == "save" and info.get("step") not in (None, step):
            break
        out.append(rec)
    return out


def _explore_power_loss(scenario: Scenario, plan: cluster.LaunchPlan, env: Environment,
                        outcome: cluster.ClusterResult, scratch: Path) -> Check | None:
    """Every crash state of the traced save, recovered by the real checkpointer: one complete committed state?"""
    fired = [(f.index, f) for f in outcome.fired() if f.kind == "powerloss" and f.index in env.snapshots]
    if not fired:
        return None
    from chaos.judge.powerloss import PowerLossInput, explore

    index, shot = fired[0]
    fault = scenario.faults[index]
    step, attempt, ws = int(shot.step), int(shot.attempt), scenario.world_size
    logs = {r: read_events(cluster.log_path(plan.log_dir, r, attempt)) for r in range(ws)}
    committed: dict[int, dict[int, dict[str, str]]] = {}
    for r, evs in logs.items():
        for e in evs:
            if e["ev"] == "save_call" and e["step"] <= step:
                committed.setdefault(e["step"], {})[r] = e["fingerprint"]
    t_save = min((e["t"] for evs in logs.values() for e in evs if e["ev"] == "save_call" and e["step"] == step),
                 default=float("inf"))
    acked = [s for evs in logs.values() for e in evs if e["ev"] == "ack" and e["t"] < t_save for s in e["steps"]]
    inp = PowerLossInput(
        ckpt_root=str(plan.ckpt_root), base=env.snapshots[index],
        traces=[_save_trace(plan.log_dir, r, attempt, env.trace_marks[index][r], step) for r in range(ws)],
        checkpointer=scenario.checkpointer, world_size=ws, workload=scenario.workload.to_dict(), step=step,
        committed=committed, acked_before=max(acked) if acked else None, ckpt_options=dict(scenario.ckpt_options),
        seed=int(fault.param("seed", 0)), max_states=int(fault.param("max_states", 200)),
        exhaustive_limit=int(fault.param("max_states", 200)),
        scratch=str(scratch / "crash-states"))
    report = explore(inp)
    return Check("atomic_commit", report.passed, report.summary(), report.to_dict(max_violations=20))


def _unfired_io_faults(scenario: Scenario, record: RunRecord) -> str | None:
    """An I/O fault that never fired tested nothing: say so (and why, when the I/O was invisible).

    Each I/O fault is matched by its own interposer rule (``chaos.record.points.fired_io_faults``):
    a schedule where one of two I/O faults fired still did not test the other.
    """
    from chaos.record.points import fired_io_faults

    wanted = [(i, f) for i, f in enumerate(scenario.faults) if f.family == "io"]
    fired = fired_io_faults(scenario.faults, record) if wanted else set()
    missed = [f for i, f in wanted if i not in fired]
    if not missed:
        return None
    untraced = record.io.get("untraced_files", [])
    ops = record.io.get("ops") or {}
    if ops:
        # Python-level I/O was traced, so the point was simply never reached (that rank
        # never does that op, or the attempt never ran): not a C-level writer.
        seen = ", ".join(f"{k}={v}" for k, v in sorted(ops.items()))
        why = f"no traced I/O operation matched its point (traced: {seen})"
        if untraced:
            why += (f"; files no trace saw (C-level writers, or ranks/attempts that were not traced): "
                    f"{', '.join(untraced[:5])}")
    elif untraced:
        why = f"the checkpointer's I/O was not traced (written by C-level code: {', '.join(untraced[:5])})"
    else:
        why = "no I/O operation matched its point"
    also = f" ({len(wanted) - len(missed)} of the {len(wanted)} I/O faults fired)" if len(missed) < len(wanted) else ""
    return f"skipped: I/O fault {missed[0].spec()} never fired{also}: {why}"


def _unfired_faults(scenario: Scenario, outcome: cluster.ClusterResult) -> str | None:
    """A supervisor-side fault (process, corruption, disk, network, power) whose point the job never reached."""
    fired = {f.index for f in outcome.fired()}
    missed = [f for i, f in enumerate(scenario.faults) if f.family != "io" and i not in fired]
    if not missed:
        return None
    return (f"skipped: fault {missed[0].spec()} never fired (the job never reached its point in attempt "
            f"{missed[0].attempt}); the run passed but tested nothing")


class _Spans:
    """Times the runner's own stages into ``ScenarioResult.spans``: ``with spans("judge"): ...``."""

    def __init__(self, out: list[tuple[str, float, float]]) -> None:
        self.out = out

    def __call__(self, name: str) -> Any:
        import contextlib

        @contextlib.contextmanager
        def span() -> Any:
            t0 = time.time()
            try:
                yield
            finally:
                self.out.append((name, t0, time.time()))

        return span()


def run_scenario(scenario: Scenario, options: RunOptions | None = None,
                 progress: Callable[[str, dict[str, Any]], None] | None = None) -> ScenarioResult:
    """Run and judge one scenario. Bad input raises ConfigError; harness faults become verdict 'error'.

    Called by ``chaos run`` (through ``chaos.run.campaign.run_pipelined``), ``chaos replay``,
    the pytest plugin and the benches. The result's ``spans`` say how long each stage took.
    """
    return ScenarioRun(scenario, options, progress).run()


class ScenarioRun:
    """One scenario in two halves: ``ranks()`` runs everything that needs the cores (the
    golden run when it is not cached, the faulted run, the final load, power-loss
    exploration, and after a rank was lost for good the fault-free run at the new world
    size when it is not cached), ``finish()`` everything after (record, hygiene, oracles,
    clean-up).

    ``run_scenario`` calls both. ``chaos.run.campaign.run_pipelined`` calls ``finish`` of one
    scenario in a thread while the next one's ``ranks`` run: the second half reads logs,
    looks for leftovers of its own scenario only and removes its scratch root, so the
    two never share a core-bound phase. Call ``ranks()`` once, then ``finish()`` once,
    whatever ``ranks()`` raised (``run`` does); ``finish`` re-raises a ConfigError.
    """

    def __init__(self, scenario: Scenario, options: RunOptions | None = None,
                 progress: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.scenario, self.options, self.progress = scenario, options or RunOptions(), progress
        self.result = ScenarioResult(scenario, "error")
        self.spans = _Spans(self.result.spans)
        self.started = time.time()
        self.scratch: Path | None = None
        self._raised: BaseException | None = None  # what ranks() raised, for finish() to act on
        self._done = False  # the verdict is already decided (skipped), nothing left to judge
        self._state: dict[str, Any] = {}

    def run(self) -> ScenarioResult:
        try:
            self.ranks()
        except BaseException:  # noqa: BLE001 - kept in self._raised: finish() judges or re-raises it
            pass
        return self.finish()

    def ranks(self) -> None:
        """Set-up, golden, environment, faulted run, final load, exploration, resized reference: the core-bound half.

        Whatever it raises is also kept for ``finish()``, which must be called next.
        """
        scenario, options, spans = self.scenario, self.options, self.spans
        try:
            with spans("set-up"):
                scenario.validate()
                scenario.checkpointer = validate_spec(scenario.checkpointer)
                cluster.warm_up()
                self.started = time.time()  # ``seconds`` leaves out the fork server's one-off start
                if options.scratch_base:
                    Path(options.scratch_base).mkdir(parents=True, exist_ok=True)
                scratch = self.scratch = Path(make_root("chaos-", options.scratch_base, keep=options.keep))
            self.result.scratch = str(scratch) if options.keep else None
            self._ranks(scratch)
        except BaseException as exc:
            self._raised = exc
            raise

    def _ranks(self, scratch: Path) -> None:
        scenario, options, spans, result = self.scenario, self.options, self.spans, self.result
        note = self.progress or (lambda event, info: None)
        note("phase", {"phase": "golden run"})
        with spans("golden"):
            golden = get_golden(scenario.workload, scenario.world_size, scratch, cache_dir=options.cache_dir,
                                use_cache=options.use_golden_cache)
        result.golden, result.golden_cached = golden, golden.cached
        log_dir = scratch / "logs"
        plan = cluster.LaunchPlan(
            world_size=scenario.world_size, workload=scenario.workload.to_dict(), log_dir=str(log_dir),
            checkpointer=scenario.checkpointer, ckpt_options=dict(scenario.ckpt_options),
            ckpt_root=str(scratch / "ckpt"), faults=list(scenario.faults), max_restarts=scenario.max_restarts,
            hang_timeout_s=options.hang_timeout_s, attempt_timeout_s=options.attempt_timeout_s,
            progress=self.progress, scratch=str(scratch),
        )
        verify = None
        driver = open_driver(scenario.driver, scratch, scenario.image)
        try:
            with driver, Environment(driver.env_faults(scenario.faults), scenario.world_size, plan.ckpt_root,
                                     plan.log_dir, scenario.workload.save_every,
                                     storage=scenario.ckpt_options.get("storage")) as env:
                with spans("run"):
                    outcome = driver.run(plan, env)
                if outcome.completed and not outcome.config_error:
                    note("phase", {"phase": "verification"})
                    with spans("final load"):
                        verify = driver.verify(dataclasses.replace(plan, world_size=outcome.final_world_size
                                                                    or plan.world_size), env)
                if any(f.family == "powerloss" for f in scenario.faults):
                    note("phase", {"phase": "power-loss exploration"})
                with spans("power-loss exploration"):
                    powerloss = _explore_power_loss(scenario, plan, env, outcome, scratch)
                suffix = env.lab.suffix if env.lab is not None else None
                env_exit = time.time()
        except Unsupported as exc:
            result.verdict, result.error = "skipped", f"skipped: {exc}"
            self._done = True
            return
        result.spans.append(("environment teardown", env_exit, time.time()))
        resized: dict[int, ResizedReference | str] = {}
        if any(a.world_size not in (None, scenario.world_size) for a in outcome.attempts):
            # A rank lost for good: the attempts at the smaller world size are compared with a
            # fault-free run at that size from the checkpoint they resumed from (ranks: here).
            note("phase", {"phase": "fault-free run at the new world size"})
            with spans("resized reference"):
                resized = get_resized_references(
                    scenario.workload, scenario.world_size, RunRecord.collect(outcome, str(log_dir), scenario.world_size),
                    scratch, cache_dir=options.cache_dir, use_cache=options.use_golden_cache)
        self._state = {"golden": golden, "plan": plan, "driver": driver, "outcome": outcome, "verify": verify,
                       "powerloss": powerloss, "suffix": suffix, "resized": resized}

    def finish(self) -> ScenarioResult:
        """Record, hygiene, oracles, verdict, clean-up: reads files, needs no core of its own.

        Turns what ``ranks()`` raised into the verdict as ``run_scenario`` always has
        (ChaosError and other exceptions: ``error``; ConfigError and interrupts are
        raised again, after the clean-up).
        """
        result, spans = self.result, self.spans
        try:
            if self._raised is not None:
                raise self._raised
            if not self._done and self._state:
                self._judge()
        except ConfigError:
            raise
        except ChaosError as exc:
            result.verdict, result.error = "error", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported as a harness error with its type
            result.verdict, result.error = "error", f"harness error: {type(exc).__name__}: {exc}"
        finally:
            if self.scratch is not None:
                from chaos.target.workload.spec import SCENARIO_ENV
                from faults.process import marked_with

                with spans("clean-up"):
                    _clean_leftovers({"processes": marked_with(SCENARIO_ENV, str(self.scratch))}, self.scratch)
                    if not self.options.keep:
                        shutil.rmtree(self.scratch, ignore_errors=True)
            result.seconds = time.time() - self.started
        return result

    def _judge(self) -> None:
        scenario, spans, result, state = self.scenario, self.spans, self.result, self._state
        scratch = self.scratch
        assert scratch is not None
        outcome, plan, verify, driver = state["outcome"], state["plan"], state["verify"], state["driver"]
        log_dir = plan.log_dir
        with spans("record"):
            record = RunRecord.collect(outcome, str(log_dir), scenario.world_size, plan.ckpt_root)
            if verify is not None:
                record.verify = _verify_record(verify, str(log_dir), outcome.final_world_size or scenario.world_size)
        with spans("hygiene"):
            found = _leftovers(record, scratch, state["suffix"])  # observe first, then clean
            _clean_leftovers(found, scratch)
            record.hygiene = driver.hygiene(found)
        result.record = record
        if outcome.config_error:
            msgs = [e["message"] for e in record.errors() if e.get("kind") == "config"]
            raise ConfigError(msgs[0] if msgs else "a rank rejected its configuration")
        with spans("judge"):
            result.oracles = judge(state["golden"], record, loss_band=scenario.loss_band,
                                   nondeterministic=scenario.workload.nondeterministic, resized=state["resized"])
            if state["powerloss"] is not None:
                result.oracles["atomic_commit"] = state["powerloss"]
            result.verdict = _verdict(result.oracles)
            missed = (_unfired_io_faults(scenario, record) or _unfired_faults(scenario, outcome)
                      or idle_faults(outcome.fired()))
        if missed and result.verdict == "pass":
            # Judged first: a fault that never fired turns only a pass into skipped (a green
            # verdict would claim more than was tested); a real failure stays a failure.
            result.verdict, result.error = "skipped", missed
