"""The results JSON every consumer reads (CI, reports, replay): one document per run, of either target.

Its shape is ``chaos.model.resultschema.SCHEMA``. One builder makes it for both targets, so
the two can never drift (one ``schema_version``, one ``summary`` of counts by verdict, one
``environment``): :func:`results_document` for the built-in workload's scenarios
(``chaos run [--fault ...]``, the pytest plugin), with the ``campaign`` when a budget ran;
:func:`job_results_document` for a job's points (``chaos run -- COMMAND``), with ``job``: the
spec, the fault-free runs' facts, points found / tried and coverage, and
``environment.packages``, the versions of what the job's script imports. An interrupted job
point is verdict ``skipped`` with outcome ``interrupted``, counted apart in
``summary.interrupted``. ``origin`` (``resultschema.origin_record``) lets ``chaos replay``
tell a file this user wrote on this host from one that came from elsewhere.

Called by ``chaos.cli.main`` (the built-in run), ``chaos.cli.job`` (a job run, rewritten
after each point, so a harness killed outright leaves what it had) and ``chaos.cli.plugin``.
It imports neither the built-in's runner nor torch: a job run never needs them.
"""

from __future__ import annotations

import platform
import re
from collections import Counter
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos import __version__
from chaos.model.jobspec import JobSpec
from chaos.model.resultschema import origin_record
from chaos.run.explore import INTERRUPTED, Exploration, PointResult
from reports.jsonfile import write_json_atomic

if TYPE_CHECKING:
    from chaos.run.runner import ScenarioResult

SCHEMA_VERSION = 1
VERDICTS = ("pass", "fail", "error", "skipped")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _document(verdicts: list[str], scenarios: list[dict[str, Any]], environment: dict[str, Any] | None = None,
              summary: dict[str, int] | None = None, **top: Any) -> dict[str, Any]:
    """The document both targets share; ``top``: the target's own keys (``campaign``, ``job``)."""
    counts = Counter(verdicts)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "summary": {v: counts.get(v, 0) for v in VERDICTS} | {"total": len(verdicts)} | (summary or {}),
        "environment": {"chaos": __version__, "torch": _version("torch"), "python": platform.python_version(),
                        "platform": platform.platform(), **(environment or {})},
        **{k: v for k, v in top.items() if v is not None},
        "scenarios": scenarios,
    }
    origin = origin_record(doc)  # what lets chaos replay run it without --yes (chaos.model.resultschema)
    if origin is not None:
        doc["origin"] = origin
    return doc


def results_document(results: list[ScenarioResult], campaign: dict[str, Any] | None = None) -> dict[str, Any]:
    """The built-in workload's document; ``campaign`` (generated schedules, skips, fault-point
    coverage) when a budget ran."""
    return _document([r.verdict for r in results], [r.to_dict() for r in results], campaign=campaign)


def job_packages(job: JobSpec) -> dict[str, str]:
    """Installed versions of the third-party distributions the job's script imports, by canonical name.

    Recorded as the results' ``environment.packages`` so that whoever reads the results
    later (``chaos findings``'s version column, an upstream report) knows which framework
    versions the points ran against, on any machine. The script is COMMAND's one local
    ``.py`` file (``chaos.target.job.script.job_script``, read by ``script.script_packages``); with
    none (``python -m``, a binary) the frameworks of ``chaos.target.job.script.FRAMEWORKS`` that
    are installed stand in. The harness itself and the standard library are left out.
    """
    from chaos.target.job.script import FRAMEWORKS, job_script, script_packages

    script = job_script(job)
    if script is None:
        return {d: v for d in FRAMEWORKS if (v := _version(d))}
    # the canonical name (PEP 503): Jinja2 -> jinja2
    return {re.sub(r"[-_.]+", "-", d).lower(): v for d, v in script_packages(str(script.path)).items()}


def job_results_document(job: JobSpec, exploration: Exploration | None, results: list[PointResult],
                         progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job's document. ``exploration``: None while points still run (``cli.job`` rewrites the
    file after each one); ``progress`` then gives the ``job`` entry's ``points_found`` /
    ``points_chosen`` / ``points_tried`` so far (a report of such a file says how far it got),
    or ``interrupted`` where a run stopped before its points. An interrupted point
    (``explore.INTERRUPTED``) is counted apart: ``summary.interrupted`` (of the skipped) and
    ``job.outcomes.interrupted``.
    """
    outcomes = Counter(r.verdict.outcome for r in results)
    job_doc: dict[str, Any] = {"spec": job.to_dict(), "outcomes": dict(sorted(outcomes.items()))}
    if progress:
        job_doc.update(progress)
    if exploration is not None:
        job_doc.update(exploration.to_dict())
    interrupted = {INTERRUPTED: outcomes[INTERRUPTED]} if outcomes.get(INTERRUPTED) else None
    environment: dict[str, Any] = {"packages": job_packages(job)}
    if job.launcher == "docker":  # which engine and which image (by id: a tag moves) the copies ran on
        from chaos.launch.containers import describe

        environment["docker"] = describe(job.image)
    return _document([r.verdict.verdict for r in results], [r.to_dict() for r in results],
                     environment, interrupted, job=job_doc)


def write_results(path: str | Path, doc: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a results file."""
    write_json_atomic(path, doc, indent=1, default=str)


def exit_status(verdicts: Iterable[str]) -> int:
    """0 all pass (or skipped), 1 any fail, 2 any harness error (results not trustworthy). An
    interrupted job run exits 128 + the signal instead (``cli.job``)."""
    seen = set(verdicts)
    if "error" in seen:
        return 2
    return 1 if "fail" in seen else 0
