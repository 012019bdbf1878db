"""pytest plugin (entry point ``pytest11``): markers, options and fixtures for chaos suites.

A test asks the ``chaos`` fixture to run a scenario and ``chaos.check(result)`` to
assert on it; a failure message names the oracle, its evidence and the one-line
replay command, and the same facts go into JUnit XML as properties.

``check`` raises a typed error: ``oracle_failed(name)`` for a verdict that failed
because oracle ``name`` failed (a subclass of every failing oracle's type when several
did), a plain ``ChaosVerdictError`` for an error or a skip. A strict xfail of a known
defect names the oracle that must catch it —
``xfail(strict=True, raises=oracle_failed("atomic_commit"))`` — so any other breakage
is not counted as the documented defect.

A team's own training job goes through the same fixture: ``chaos.job(COMMAND, ...)``
runs ``chaos run -- COMMAND`` in-process (two fault-free runs, then each point killed
and resumed, judged pass / hard_failure / silent_divergence / lost_work) inside the
session's scratch root, and ``chaos.check(result)`` raises ``job_failed(outcome)``
listing every failing point's outcome, summary and replay command::

    @pytest.mark.chaos
    def test_train_survives_crashes(chaos):
        result = chaos.job(["python", "train.py", "--out", "{out}"], ranks=2, max_points=20,
                           result_files=["final.pt"])
        chaos.check(result)

A job run in which no point fired (every point skipped, or none ran) is not a pass:
``check`` raises ``ChaosVerdictError`` for it, as for a harness error. A known defect
is ``xfail(strict=True, raises=job_failed("hard_failure"), reason=...)``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.judge.job import FAILURES
from chaos.model.grammar import parse_fault
from chaos.plan.scenario import Scenario
from chaos.run.runner import RunOptions, ScenarioResult, run_scenario
from chaos.target.workload.config import WorkloadConfig

MARKERS = {
    "chaos": "a real multi-process fault scenario (run with -m chaos)",
    "slow": "long-running; excluded unless the -m expression names it (-m slow, -m 'chaos and slow')",
    "root": "needs root (mounts, namespaces)",
    "s3": "needs the embedded S3 endpoint",
    "gpu": "needs CUDA (NCCL); gpu(count=N): N GPUs. Skips with the reason where they are missing",
    "docker": "needs a Docker engine",
    "bench": "benchmark; reports ratios, asserts no timings; excluded unless the -m expression names it",
    "storage": "certifies real mounts (s3fs, rclone, loop images) end to end; minutes each, so excluded unless "
               "the -m expression names it; the nightly runs it. Skips without root, FUSE or the tools",
    "frameworks": "needs the frameworks extra (transformers, Lightning, Accelerate); skips without it, "
                  "runs in the nightly (.ci/nightly installs it)",
}
BUILTINS = ("reference", "dcp", "dcp-async", "torch-save")
# Built-ins the per-commit run leaves to the nightly (marked slow unless --chaos-checkpointer names them).
NIGHTLY_CHECKPOINTERS = ("dcp-async",)


class ChaosVerdictError(AssertionError):
    """A scenario's verdict was not the one a test expected; ``result`` is the whole evidence."""

    def __init__(self, message: str, result: ScenarioResult | JobResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class OracleFailed(ChaosVerdictError):
    """The verdict failed because oracles failed; ``oracle_failed(name)`` is the type for one of them."""

    oracles: tuple[str, ...] = ()


_ORACLE_TYPES: dict[tuple[str, ...], type[OracleFailed]] = {}


def oracle_failed(*names: str) -> type[OracleFailed]:
    """The error ``check`` raises when exactly these oracles failed (one name: the type an xfail names).

    Several failing oracles give a type derived from each one's own, so
    ``raises=oracle_failed("atomic_commit")`` also matches a failure of atomic_commit
    together with another oracle, and matches nothing where atomic_commit passed.
    """
    key = tuple(sorted(set(names)))
    if not key:
        raise ValueError("oracle_failed needs at least one oracle name")
    cls = _ORACLE_TYPES.get(key)
    if cls is None:
        title = "And".join("".join(part.title() for part in n.split("_")) for n in key)
        bases = (OracleFailed,) if len(key) == 1 else tuple(oracle_failed(n) for n in key)
        cls = type(f"{title}Failed", bases, {"oracles": key, "__module__": __name__,
                                             "__doc__": f"Oracle(s) {', '.join(key)} failed."})
        _ORACLE_TYPES[key] = cls
    return cls


class JobFailed(ChaosVerdictError):
    """A job's points failed; ``job_failed(outcome)`` is the type for one outcome (the type an xfail names)."""

    outcomes: tuple[str, ...] = ()


_JOB_TYPES: dict[tuple[str, ...], type[JobFailed]] = {}
JOB_OUTCOMES = FAILURES  # chaos.judge.job's failing outcomes, worst first


def job_failed(*outcomes: str) -> type[JobFailed]:
    """The error ``check`` raises when a job's failing points had exactly these outcomes.

    As ``oracle_failed``: several outcomes give a type derived from each one's own, so
    ``raises=job_failed("hard_failure")`` matches a run with hard failures (and maybe
    lost work too) and nothing else. Outcomes are ``chaos.judge.job``'s failing ones:
    code_execution, hard_failure, silent_divergence, lost_work.
    """
    key = tuple(sorted(set(outcomes)))
    if not key:
        raise ValueError("job_failed needs at least one outcome")
    unknown = [o for o in key if o not in JOB_OUTCOMES]
    if unknown:
        raise ValueError(f"job_failed: unknown outcome(s) {', '.join(unknown)}; known: {', '.join(JOB_OUTCOMES)}")
    cls = _JOB_TYPES.get(key)
    if cls is None:
        title = "And".join("".join(part.title() for part in o.split("_")) for o in key)
        bases = (JobFailed,) if len(key) == 1 else tuple(job_failed(o) for o in key)
        cls = type(f"Job{title}", bases, {"outcomes": key, "__module__": __name__,
                                          "__doc__": f"Job point(s) failed with {', '.join(key)}."})
        _JOB_TYPES[key] = cls
    return cls


@dataclass
class JobResult:
    """One ``chaos.job(...)`` run: the spec, the exploration and its results document.

    ``verdict`` sums the points up: ``error`` if any point erred, ``fail`` if any failed,
    ``pass`` if at least one passed (the rest skipped), ``skipped`` when no point fired
    at all (every point skipped, or none ran): nothing was tested, so it is no pass.
    """

    job: Any            # chaos.model.jobspec.JobSpec
    exploration: Any    # chaos.run.explore.Exploration
    document: dict[str, Any]

    @property
    def points(self) -> list[Any]:
        """Each point run (``chaos.run.explore.PointResult``), in the fault-free run's order."""
        return list(self.exploration.results)

    @property
    def verdict(self) -> str:
        verdicts = {r.verdict.verdict for r in self.points}
        for v in ("error", "fail", "pass"):
            if v in verdicts:
                return v
        return "skipped"

    def failing(self) -> list[Any]:
        return [r for r in self.points if r.verdict.verdict in ("fail", "error")]

    @property
    def outcomes(self) -> dict[str, int]:
        return dict(sorted(Counter(r.verdict.outcome for r in self.points).items()))

    @property
    def replay(self) -> str:
        """The command that reruns this whole exploration (each failing point has its own)."""
        return self.job.replay_command()

    def explain(self, limit: int = 10) -> str:
        tally = ", ".join(f"{n} {k}" for k, n in self.outcomes.items()) or "no point run"
        found = self.exploration.found
        lines = [f"job {shlex.join(self.job.command)}: verdict {self.verdict} ({tally}; "
                 f"{len(self.points)}/{found} point(s) tried)"]
        bad = self.failing()
        for r in bad[:limit]:
            where = f" ({r.point.kind} {r.point.path})" if r.point.kind else ""
            lines.append(f"  {r.verdict.outcome.upper()} {r.point.id}{where}: {r.verdict.summary}")
            lines.append(f"    replay: {r.replay}")
        if len(bad) > limit:
            lines.append(f"  ... and {len(bad) - limit} more failing point(s)")
        if self.verdict == "skipped":
            why = {r.verdict.summary for r in self.points}
            lines.append("  no point fired, so the job was not tested" + (f": {'; '.join(sorted(why))}" if why else ""))
        lines.append(f"  rerun: {self.replay}")
        return "\n".join(lines)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "chaos harness")
    group.addoption("--chaos-checkpointer", action="append", default=[],
                    help="checkpointer(s) the suites parametrize over (default: all built-ins)")
    group.addoption("--chaos-world-size", type=int, default=2)
    group.addoption("--chaos-seed", type=int, default=0)
    group.addoption("--chaos-budget", type=float, default=0.0,
                    help="seconds of extra property-based exploration (0 = the small default)")
    group.addoption("--chaos-driver", choices=("process", "docker"), default="process",
                    help="run every scenario's ranks as processes (default) or Docker containers "
                         "(a private engine is started for the session)")
    group.addoption("--chaos-json", default=None, help="write every scenario run in this session to a results JSON")
    group.addoption("--chaos-cache-dir", default=None, help="golden-run cache (default: a session temp dir)")
    group.addoption("--chaos-loss-band", type=float, default=None,
                    help="loss_continuity's relative band around the golden loss (default 0.005)")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


OPT_IN = ("slow", "bench", "storage")  # markers whose tests run only when the -m expression names them


def opted_in(markexpr: str) -> set[str]:
    """Which of :data:`OPT_IN` the ``-m`` expression names (``"chaos and not slow"`` names slow)."""
    import re

    return {m for m in OPT_IN if re.search(rf"(?<![\w.]){m}(?![\w.])", markexpr or "")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out ``slow``, ``bench`` and ``storage`` tests unless the ``-m`` expression names them.

    A ``-m`` given on the command line replaces the one in ``addopts``, so a default of
    ``-m "not slow"`` there made the CI command of the design card, ``pytest suites/ -m
    chaos``, select the long campaigns too. Here the rule holds whatever ``-m`` is given:
    ``-m chaos`` is the per-commit set, ``-m "chaos and slow"`` or ``-m slow`` (the nightly's
    ``(gpu or slow or frameworks) and not bench``) opt in. A test marked ``slow`` that the
    expression also selects by its name alone (``-k``) stays out: say ``-m slow``.
    """
    keep_marked = opted_in(config.getoption("markexpr", "") or "")
    left_out = [item for item in items
                if any(item.get_closest_marker(m) is not None for m in OPT_IN if m not in keep_marked)]
    if left_out:
        chosen = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in chosen]
        config.hook.pytest_deselected(items=left_out)


@pytest.hookimpl(tryfirst=True)  # before fixtures: a GPU test must not start the chaos session for nothing
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``gpu`` test skips, saying why, where CUDA or enough GPUs are missing.

    The reason is ``chaos.target.workload.device.unavailable``'s, the same the ConfigError of
    ``chaos run --device cuda`` gives: "no CUDA device: ..." or "N ranks need N CUDA devices".
    """
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return
    from chaos.target.workload.device import unavailable

    why = unavailable(int(marker.kwargs.get("count", 1)))
    if why is not None:
        pytest.skip(why)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A suite's ``checkpointer`` argument: each ``--chaos-checkpointer``, else every built-in.

    Without the option, the built-ins of :data:`NIGHTLY_CHECKPOINTERS` are marked ``slow``:
    the per-commit run keeps one DCP writer (``dcp``) and the nightly adds its async twin,
    which writes the same files from a background thread. Named with the option, a
    checkpointer always runs.
    """
    if "checkpointer" in metafunc.fixturenames and not any(
        m.name == "parametrize" and "checkpointer" in m.args[0] for m in metafunc.definition.iter_markers()
    ):
        chosen = metafunc.config.getoption("--chaos-checkpointer")
        if chosen:
            metafunc.parametrize("checkpointer", chosen)
        else:
            metafunc.parametrize("checkpointer", [
                pytest.param(name, marks=pytest.mark.slow) if name in NIGHTLY_CHECKPOINTERS else name
                for name in BUILTINS])


@dataclass
class ChaosSession:
    options: RunOptions
    world_size: int
    seed: int
    results: list[ScenarioResult] = field(default_factory=list)
    driver: str = "process"
    jobs: list[JobResult] = field(default_factory=list)
    loss_band: float | None = None


@pytest.fixture(scope="session")
def chaos_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosSession]:
    cfg = request.config
    cache = cfg.getoption("--chaos-cache-dir")
    scratch = tmp_path_factory.mktemp("chaos-scratch")
    session = ChaosSession(
        RunOptions(scratch_base=str(scratch), cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("golden")),
        cfg.getoption("--chaos-world-size"), cfg.getoption("--chaos-seed"),
        loss_band=cfg.getoption("--chaos-loss-band"))
    session.driver = cfg.getoption("--chaos-driver")
    if session.driver == "docker":
        request.getfixturevalue("docker_engine")  # skips the session's scenarios when none can start
    yield session
    out = cfg.getoption("--chaos-json")
    if out and session.results:
        from chaos.run.results import results_document, write_results

        write_results(out, results_document(session.results))


class ChaosRunner:
    """What a test gets: run a scenario, then check it."""

    def __init__(self, session: ChaosSession, record_property: Any) -> None:
        self.session, self._record = session, record_property

    def scenario(self, checkpointer: str, faults: list[str] = (), world_size: int | None = None,
                 ckpt_options: dict[str, Any] | None = None, max_restarts: int = 3,
                 loss_band: float | None = None, **workload: Any) -> Scenario:
        cfg = WorkloadConfig(**{"seed": self.session.seed, **workload})
        return Scenario(checkpointer=checkpointer, world_size=world_size or self.session.world_size, workload=cfg,
                        faults=[parse_fault(f) for f in faults], ckpt_options=dict(ckpt_options or {}),
                        max_restarts=max_restarts,
                        loss_band=self.session.loss_band if loss_band is None else loss_band)

    def run(self, scenario: Scenario) -> ScenarioResult:
        if self.session.driver != "process" and scenario.driver == "process":
            scenario = dataclasses.replace(scenario, driver=self.session.driver, id="")
        result = run_scenario(scenario, self.session.options)
        self.session.results.append(result)
        self._record("chaos_scenario", scenario.id)
        self._record("chaos_verdict", result.verdict)
        self._record("chaos_replay", result.replay)
        return result

    def job(self, command: Sequence[str] | str, *, ranks: int | None = None, max_points: int | None = None,
            result_files: Sequence[str] = (), resume_command: Sequence[str] | str | None = None,
            step_regex: str | None = None, loss_regex: str | None = None, loss_band: float | None = None,
            checkpoint_glob: str | None = None, max_restarts: int | None = None,
            timeout: float | None = None, budget: float | None = None, jobs: int | None = None,
            seed: int | None = None, point: str | None = None, cwd: str | Path | None = None,
            options: Sequence[str] = (), keep: bool = False) -> JobResult:
        """Put a training job under chaos, as ``chaos run [options] -- COMMAND`` would.

        ``command`` is an argv list (or one shell-quoted string) with ``{out}`` where the
        job takes its output directory; a relative script path resolves against ``cwd``
        (default: the current directory). The keywords are ``chaos run``'s options of the
        same name (``result_files`` is ``--result-file``, repeated); ``options`` passes
        any other ones verbatim, e.g. ``["--modes", "before,after"]``. ``point`` runs only
        that point (a replay). ``seed`` defaults to ``--chaos-seed``. Everything is
        written below the session's scratch root and removed unless ``keep``.
        """
        from chaos.cli.job import build
        from chaos.model.grammar import parse_point
        from chaos.run.explore import explore
        from chaos.run.results import job_results_document

        argv = list(command) if not isinstance(command, str) else shlex.split(command)
        flags: list[str] = []
        if ranks is not None:
            flags += ["--ranks", str(ranks)]
        for glob in result_files:
            flags += ["--result-file", glob]
        if resume_command is not None:
            flags += ["--resume-cmd", resume_command if isinstance(resume_command, str)
                      else shlex.join(resume_command)]
        for name, value in (("--step-regex", step_regex), ("--loss-regex", loss_regex), ("--loss-band", loss_band),
                            ("--checkpoint-glob", checkpoint_glob),
                            ("--max-restarts", max_restarts), ("--timeout", timeout), ("--budget", budget),
                            ("--jobs", jobs), ("--max-points", max_points), ("--point", point)):
            if value is not None:
                flags += [name, str(value)]
        flags += ["--seed", str(self.session.seed if seed is None else seed), *options]
        args, spec = build([*flags, "--", *argv])
        if cwd is not None:
            spec = dataclasses.replace(spec, cwd=str(cwd))
        scratch = self.session.options.scratch_base
        if scratch:
            os.makedirs(scratch, exist_ok=True)
        exploration = explore(spec, seed=args.seed, max_points=args.max_points, budget_s=args.budget,
                              jobs=args.jobs, only=[parse_point(p) for p in args.point] or None,
                              scratch_base=scratch, keep=keep)
        result = JobResult(spec, exploration, job_results_document(spec, exploration, exploration.results))
        self.session.jobs.append(result)
        self._record("chaos_job", shlex.join(spec.command))
        self._record("chaos_verdict", result.verdict)
        for r in result.failing():
            self._record("chaos_replay", r.replay)
        return result

    @staticmethod
    def explain(result: ScenarioResult) -> str:
        lines = [f"scenario {result.scenario.id}: verdict {result.verdict}"]
        for o in result.oracles.values():
            lines.append(f"  {o.name}: {'pass' if o.passed else 'FAIL'} - {o.summary}")
            if not o.passed and o.evidence:
                lines.append(f"    evidence: {o.evidence}")
        if result.error:
            lines.append(f"  error: {result.error}")
        lines.append(f"  replay: {result.replay}")
        return "\n".join(lines)

    def check(self, result: ScenarioResult | JobResult, expect: str = "pass") -> None:
        """Raise ``oracle_failed(...)`` (a failed verdict) or ``ChaosVerdictError`` unless the verdict is ``expect``.

        For a ``JobResult`` (from ``job``): ``job_failed(*outcomes)`` when points failed,
        its message one entry per failing point (outcome, summary, replay command);
        ``ChaosVerdictError`` for an error or a run in which no point fired.
        """
        __tracebackhide__ = True
        if result.verdict == expect:
            return
        if isinstance(result, JobResult):
            message = f"expected verdict {expect!r}\n{result.explain()}"
            outcomes = sorted({r.verdict.outcome for r in result.failing() if r.verdict.outcome in JOB_OUTCOMES})
            if result.verdict == "fail" and outcomes:
                raise job_failed(*outcomes)(message, result)
            raise ChaosVerdictError(message, result)
        message = f"expected verdict {expect!r}\n{self.explain(result)}"
        failing = [o.name for o in result.failing()]
        if result.verdict == "fail" and failing:
            raise oracle_failed(*failing)(message, result)
        raise ChaosVerdictError(message, result)


@pytest.fixture
def chaos(chaos_session: ChaosSession, record_property: Any) -> ChaosRunner:
    """Run chaos from a test, then assert on the evidence.

    Built-in workload: ``chaos.run(chaos.scenario("reference", ["rank1:step9:kill"]))``.
    Your own job (what ``chaos run -- COMMAND`` does, in-process)::

        result = chaos.job(["python", "train.py", "--out", "{out}"], ranks=2, max_points=20,
                           result_files=["final.pt"])
        chaos.check(result)   # job_failed(outcome): each failing point's outcome, summary, replay

    ``chaos.check`` passes only on a pass verdict: a job in which no point fired is
    ``skipped`` and fails the check. The verdict and each failing point's replay command
    go into JUnit XML as ``chaos_verdict`` / ``chaos_replay`` properties.
    """
    return ChaosRunner(chaos_session, record_property)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    """A private ``dockerd`` for the session (``chaos.launch.drivers.engine.PrivateEngine``), stopped
    and deleted afterwards; ``DOCKER_HOST`` points at it meanwhile. Skips, with the reason,
    where none can start (not root, no ``dockerd``, no docker SDK)."""
    import os
    import shutil

    from chaos.launch.drivers.engine import EngineUnavailable, PrivateEngine, can_start_engine
    from chaos.scratch import claim_cleanup, make_root

    ok, why = can_start_engine()
    if not ok:
        pytest.skip(f"no Docker engine can be started: {why}")
    root = make_root("chaos-eng-")  # short: Unix socket paths live under it
    claim_cleanup(root, "dockerd")  # if this session is killed, the next stops it
    engine = PrivateEngine(root)
    try:
        engine.start()
    except EngineUnavailable as exc:
        engine.stop()
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no Docker engine can be started: {exc}")
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = engine.url
    try:
        yield engine
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before
        engine.stop()
