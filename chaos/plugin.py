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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.runner import RunOptions, ScenarioResult, run_scenario
from chaos.scenario import Scenario, parse_fault
from chaos.workload.config import WorkloadConfig

MARKERS = {
    "chaos": "a real multi-process fault scenario (run with -m chaos)",
    "slow": "long-running; excluded from the default run",
    "root": "needs root (mounts, namespaces)",
    "s3": "needs the embedded S3 endpoint",
    "gpu": "needs CUDA (NCCL)",
    "docker": "needs a Docker engine",
    "bench": "benchmark; reports ratios, asserts no timings",
}
BUILTINS = ("reference", "dcp", "dcp-async", "torch-save")


class ChaosVerdictError(AssertionError):
    """A scenario's verdict was not the one a test expected; ``result`` is the whole evidence."""

    def __init__(self, message: str, result: ScenarioResult | None = None) -> None:
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "checkpointer" in metafunc.fixturenames and not any(
        m.name == "parametrize" and "checkpointer" in m.args[0] for m in metafunc.definition.iter_markers()
    ):
        chosen = metafunc.config.getoption("--chaos-checkpointer") or list(BUILTINS)
        metafunc.parametrize("checkpointer", chosen)


@dataclass
class ChaosSession:
    options: RunOptions
    world_size: int
    seed: int
    results: list[ScenarioResult] = field(default_factory=list)
    driver: str = "process"
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
        from chaos.results import write_results

        write_results(out, session.results)


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

    def check(self, result: ScenarioResult, expect: str = "pass") -> None:
        """Raise ``oracle_failed(...)`` (a failed verdict) or ``ChaosVerdictError`` unless the verdict is ``expect``."""
        __tracebackhide__ = True
        if result.verdict == expect:
            return
        message = f"expected verdict {expect!r}\n{self.explain(result)}"
        failing = [o.name for o in result.failing()]
        if result.verdict == "fail" and failing:
            raise oracle_failed(*failing)(message, result)
        raise ChaosVerdictError(message, result)


@pytest.fixture
def chaos(chaos_session: ChaosSession, record_property: Any) -> ChaosRunner:
    return ChaosRunner(chaos_session, record_property)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    """A private ``dockerd`` for the session (``chaos.drivers.engine.PrivateEngine``), stopped
    and deleted afterwards; ``DOCKER_HOST`` points at it meanwhile. Skips, with the reason,
    where none can start (not root, no ``dockerd``, no docker SDK)."""
    import os
    import shutil
    import tempfile

    from chaos.drivers.engine import EngineUnavailable, PrivateEngine, can_start_engine

    ok, why = can_start_engine()
    if not ok:
        pytest.skip(f"no Docker engine can be started: {why}")
    root = tempfile.mkdtemp(prefix="chaos-eng-")  # short: Unix socket paths live under it
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
