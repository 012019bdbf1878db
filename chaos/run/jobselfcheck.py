"""The self-check's job half: planted defects in training jobs, caught by the job oracles.

:mod:`chaos.run.selfcheck` scores the built-in workload's oracles against checkpointer
classes with one planted defect each. A user's job is judged by other oracles
(``chaos.judge.job``: liveness, committed_state, result_files, loss_continuity, no_false_ack,
durability, preemption_exit, no_code_execution), and those need the same proof that they catch what
they claim to. Here the corpus is a directory of small training jobs: ``correct.py`` (a
job that must pass every point) and one module per defect, each that job with one thing
changed. Every module declares how it is run, as literals read with :mod:`ast` (nothing
imported):

    CHAOS_JOB = {"faults": ("kill",), "result_globs": ("final.json",)}  # JobSpec fields; and
                                                                        # max_points, resume_points
    EXPECTED_CATCH = {"kill": ("durability",)}     # a defect: family -> oracle(s)

Each job is explored as ``chaos run [options] -- python JOB.py --out {out}`` would explore
it (:func:`chaos.run.explore.explore`, seed 0), and its points are grouped by fault family
into the :class:`~chaos.run.selfcheck.ProbeOutcome` rows the checkpointer corpus uses, so
one :class:`~chaos.run.selfcheck.SelfCheckReport` scores both: a defect is caught only
when one of its oracles failed at a point of one of its families; a correct job failing
any point is a false positive.

The checkpointer corpus can be judged this way too: a checkpointer module that declares
``CHAOS_AS_JOB`` (the same keys, with ``steps`` and ``save_every`` for the workload) runs
inside the built-in workload as a job, exactly as ``chaos run --as-job --checkpointer
FILE:Class`` runs it (``python -m chaos.target.workload {out} --checkpointer ...`` on two
ranks unless it says otherwise), and, a defect, declares the job families and oracles meant
to catch it there in ``EXPECTED_JOB_CATCH``. One planted defect, two pipelines, each with
its own expected catch: its rows are named ``as-job:<file>`` (:func:`discover_as_job`).

Called by ``chaos selfcheck`` (:mod:`chaos.cli.commands.selfcheck`, ``--job-corpus``,
``--as-job``) and ``tests/test_selfcheck_jobs.py``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.errors import ConfigError
from chaos.judge.registry import of_job
from chaos.model.jobspec import FAULT_KINDS, JobSpec
from chaos.run.explore import PointResult, explore
from chaos.run.selfcheck import (
    EXPECTED_NAME,
    CheckpointerReport,
    ProbeOutcome,
    SelfCheckReport,
    checkpointer_class,
    discover,
    module_literal,
    read_expected,
)
from chaos.target.workload import job as workload

DECLARATION = "CHAOS_JOB"  # a job module's run options: JobSpec fields, and max_points
EXPLORE_KEYS = ("max_points", "resume_points")  # CHAOS_JOB keys that are the exploration's, not the JobSpec's
PREFIX = "job:"  # a job's name in the report beside the checkpointers' (job:correct, job:no_fallback)
AS_JOB = "CHAOS_AS_JOB"  # a checkpointer module's run options inside the built-in workload as a job
AS_JOB_EXPECTED = "EXPECTED_JOB_CATCH"  # and the job families and oracles meant to catch its defect there
AS_JOB_PREFIX = "as-job:"
WORKLOAD_KEYS = {"steps": 8, "save_every": 2}  # CHAOS_AS_JOB keys that are the workload's, with their defaults


def job_oracles() -> list[str]:
    """Every oracle a job point's verdict can carry (``chaos.judge.registry``)."""
    return of_job()


def discover_jobs(directory: str | Path) -> dict[str, Path]:
    """``{"job:<stem>": path}`` for every module in ``directory`` that declares ``CHAOS_JOB``
    (modules starting with ``_`` are helpers)."""
    out: dict[str, Path] = {}
    for path in sorted(Path(directory).glob("*.py")):
        if not path.name.startswith("_") and module_literal(path, DECLARATION)[0]:
            out[PREFIX + path.stem] = path.resolve()
    return out


def discover_as_job(directory: str | Path) -> dict[str, Path]:
    """``{"as-job:<stem>": path}`` for every checkpointer of a checkpointer corpus (``selfcheck.discover``)
    whose module declares ``CHAOS_AS_JOB``."""
    paths = [Path(spec.rpartition(":")[0]) for spec in discover(directory).values()]
    return {AS_JOB_PREFIX + path.stem: path for path in paths if module_literal(path, AS_JOB)[0]}


def short_name(name: str) -> str:
    """A corpus entry's name without its ``job:`` or ``as-job:`` prefix (``correct*`` names a correct one)."""
    return name.removeprefix(AS_JOB_PREFIX).removeprefix(PREFIX)


@dataclass(frozen=True)
class JobDeclaration:
    """What a corpus module declares: how to run it, and (a defect) what must catch it."""

    path: Path
    spec: JobSpec
    max_points: int | None
    expected: dict[str, tuple[str, ...]]
    resume_points: int = 0  # points struck again inside their resume (explore's resume_points)


def declaration(path: Path, correct: bool) -> JobDeclaration:
    """The module's ``CHAOS_JOB`` as a JobSpec for ``python PATH --out {out}`` (or, a checkpointer
    module's ``CHAOS_AS_JOB``, for the built-in workload attacking it) and, for a defect, its
    ``EXPECTED_CATCH`` (``EXPECTED_JOB_CATCH``) over the job's fault families and oracles.
    ConfigError, naming the file, where either is missing or malformed."""
    as_job, raw = module_literal(path, AS_JOB)
    name = AS_JOB if as_job else DECLARATION
    if not as_job:
        declared, raw = module_literal(path, DECLARATION)
        if not declared:
            raw = None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a job of the self-check corpus declares {DECLARATION} = {{JobSpec field: "
                          "literal, ...}, e.g. {'faults': ('kill',), 'result_globs': ('final.json',)} (a "
                          f"checkpointer run inside the built-in workload: {AS_JOB})")
    fields = {f.name for f in dataclasses.fields(JobSpec)} - {"command", "resume_command", "cwd"}
    own = set(EXPLORE_KEYS) | (set(WORKLOAD_KEYS) if as_job else set())
    unknown = sorted(set(raw) - fields - own)
    if unknown:
        raise ConfigError(f"{path}: {name}: unknown key(s) {', '.join(map(str, unknown))}; "
                          f"known: {', '.join(sorted(fields | own))}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k not in own}
    for key in ("max_points", "resume_points", *(WORKLOAD_KEYS if as_job else ())):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{path}: {name}[{key!r}] must be a positive integer, got {value!r}")
    if as_job:
        cls = checkpointer_class(path)
        if cls is None:
            raise ConfigError(f"{path}: {AS_JOB} is declared, but the module defines no *Checkpointer class")
        workload_args = [a for k, default in WORKLOAD_KEYS.items()
                         for a in (f"--{k.replace('_', '-')}", str(raw.get(k, default)))]
        command = tuple(workload.command(f"{path.resolve()}:{cls}", *workload_args))
        kwargs = {"ranks": 2, "result_globs": (workload.RESULT_FILES,), **kwargs}
    else:
        command = (sys.executable, str(path), "--out", "{out}")
    try:
        spec = JobSpec(command=command, cwd=str(path.parent), **kwargs)
    except (TypeError, ConfigError) as exc:  # a field of the wrong kind, or a value JobSpec refuses
        raise ConfigError(f"{path}: {name}: {exc}") from None
    expected = {} if correct else read_expected(path, FAULT_KINDS, job_oracles(), example={"kill": ("durability",)},
                                                name=AS_JOB_EXPECTED if as_job else EXPECTED_NAME)
    return JobDeclaration(path, spec, raw.get("max_points"), expected, raw.get("resume_points") or 0)


@dataclass
class JobSelfCheckOptions:
    """``max_points``: at most this many points per job (the exploration's own sample, which
    takes every family and save first); None: each job's declared ``max_points``, else all.
    ``jobs``: points run at once. ``progress(name, outcome)`` after each job's family."""

    max_points: int | None = None
    jobs: int = 2
    seed: int = 0
    scratch_base: str | None = None
    progress: Callable[[str, ProbeOutcome], None] | None = None


def _family_outcome(family: str, results: list[PointResult]) -> ProbeOutcome:
    """One family's points as one row: fail if any point failed (the oracles failed at any of
    them), else error if any erred, else pass if any passed, else skipped."""
    failed = [r for r in results if r.verdict.verdict == "fail"]
    verdicts = {r.verdict.verdict for r in results}
    verdict = ("fail" if failed else "error" if "error" in verdicts else "pass" if "pass" in verdicts
               else "skipped")
    failing = sorted({n for r in failed for n, o in r.verdict.oracles.items() if o.failed},
                     key=lambda n: job_oracles().index(n) if n in job_oracles() else len(job_oracles()))
    first = failed[0] if failed else next((r for r in results if r.verdict.verdict == "error"), None)
    summaries: dict[str, str] = {}
    for r in failed:
        for n, o in r.verdict.oracles.items():
            if o.failed:
                summaries.setdefault(n, f"{r.point.id}: {o.summary}"[:400])
    counts = {v: sum(1 for r in results if r.verdict.verdict == v) for v in ("pass", "fail", "skipped", "error")}
    note = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    summary = (f"{first.point.id}: {first.verdict.summary}" if first is not None else f"{len(results)} point(s): {note}")
    return ProbeOutcome(family, tuple(r.point.id for r in results), verdict, failing, summary[:600],
                        round(sum(r.seconds for r in results), 2), first.replay if first is not None else "",
                        f"{len(results)} point(s): {note}", summaries)


def run_job(name: str, decl: JobDeclaration, correct: bool, options: JobSelfCheckOptions) -> CheckpointerReport:
    """Explore one corpus job and score it as the checkpointer corpus is scored."""
    report = CheckpointerReport(name, str(decl.path), correct, expected=decl.expected)
    max_points = options.max_points if options.max_points is not None else decl.max_points
    exploration = explore(decl.spec, seed=options.seed, max_points=max_points, jobs=options.jobs,
                          scratch_base=options.scratch_base, resume_points=decl.resume_points)
    by_family: dict[str, list[PointResult]] = {}
    for r in exploration.results:
        by_family.setdefault(r.point.family, []).append(r)
    for family in (f for f in FAULT_KINDS if f in by_family):
        outcome = _family_outcome(family, by_family[family])
        report.outcomes.append(outcome)
        if options.progress is not None:
            options.progress(name, outcome)
    return report


def run_job_selfcheck(corpus: dict[str, Path], options: JobSelfCheckOptions | None = None,
                      correct: set[str] | None = None) -> SelfCheckReport:
    """Every job of ``corpus`` (``discover_jobs``) explored and scored. ``correct``: the names
    expected to pass (default: those whose file name starts with ``correct``). Every
    declaration is read, and checked, before anything runs."""
    options = options or JobSelfCheckOptions()
    good = correct if correct is not None else {n for n in corpus if short_name(n).startswith("correct")}
    decls = {name: declaration(path, name in good) for name, path in corpus.items()}
    started = time.time()
    reports = [run_job(name, decl, name in good, options) for name, decl in decls.items()]
    return SelfCheckReport(reports, time.time() - started)


def default_corpus(checkpointer_corpus: str | os.PathLike[str]) -> Path:
    """Where the job corpus lies beside a checkpointer corpus: its ``jobs/`` folder."""
    return Path(checkpointer_corpus) / "jobs"


__all__ = ["AS_JOB", "AS_JOB_EXPECTED", "AS_JOB_PREFIX", "DECLARATION", "PREFIX", "JobDeclaration",
           "JobSelfCheckOptions", "declaration", "default_corpus", "discover_as_job", "discover_jobs", "job_oracles",
           "run_job", "run_job_selfcheck", "short_name"]

