"""The results JSON of a job run: the document ``chaos run --json`` always writes.

The same shape as ``chaos.run.results`` (``schema_version``, ``summary`` counts by
verdict, ``environment``, ``scenarios``: one entry per point with ``id``, ``seed``,
``faults``, ``verdict``, ``oracles`` (name -> result / summary / evidence) and
``replay``; an interrupted point is ``skipped`` with outcome ``interrupted``, counted apart in
``summary.interrupted``; ``environment`` also names the versions of the packages the job's script
imports, :func:`job_packages`), plus ``job``: the spec, the fault-free runs' facts,
points found / tried and coverage, and ``origin`` (``chaos.model.resultschema``: who wrote it
where, for ``chaos replay``). Its shape is ``chaos.model.resultschema.SCHEMA``. Built here rather than by ``chaos.run.results``
because that module imports the built-in workload's runner, and with it torch (~2 s),
which a job run never needs.
"""

from __future__ import annotations

import platform
import re
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from chaos import __version__
from chaos.model.jobspec import JobSpec
from chaos.model.resultschema import origin_record
from chaos.run.explore import INTERRUPTED, Exploration, PointResult
from reports.jsonfile import write_json_atomic

SCHEMA_VERSION = 1  # chaos.run.results.SCHEMA_VERSION (tests/test_job_cli.py keeps them equal)
VERDICTS = ("pass", "fail", "error", "skipped")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


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


def results_document(job: JobSpec, exploration: Exploration | None, results: list[PointResult],
                     progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results document. ``exploration``: None while points still run (``cli_job`` rewrites the
    file after each one, so a harness killed outright leaves what it had); ``progress`` then gives
    the ``job`` entry's ``points_found`` / ``points_chosen`` / ``points_tried`` so far (a report of
    such a file says how far it got), or ``interrupted`` where a run stopped before its points.

    An interrupted point (``explore.INTERRUPTED``) is verdict ``skipped`` for every reader of
    the schema, and counted apart: ``summary.interrupted`` (of the skipped) and
    ``job.outcomes.interrupted``.
    """
    counts = Counter(r.verdict.verdict for r in results)
    outcomes = Counter(r.verdict.outcome for r in results)
    job_doc: dict[str, Any] = {"spec": job.to_dict(), "outcomes": dict(sorted(outcomes.items()))}
    if progress:
        job_doc.update(progress)
    if exploration is not None:
        job_doc.update(exploration.to_dict())
    summary = {v: counts.get(v, 0) for v in VERDICTS} | {"total": len(results)}
    if outcomes.get(INTERRUPTED):
        summary[INTERRUPTED] = outcomes[INTERRUPTED]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "summary": summary,
        "environment": {"chaos": __version__, "torch": _version("torch"), "python": platform.python_version(),
                        "platform": platform.platform(), "packages": job_packages(job)},
        "job": job_doc,
        "scenarios": [r.to_dict() for r in results],
    }
    origin = origin_record(doc)  # what lets chaos replay run it without --yes (chaos.model.resultschema)
    if origin is not None:
        doc["origin"] = origin
    return doc


def write_results(path: str | Path, doc: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a results file."""
    write_json_atomic(path, doc, indent=1, default=str)


def exit_status(results: list[PointResult]) -> int:
    """0 all pass (or skipped), 1 any fail, 2 any harness error (an interrupted run: 128 + the signal,
    ``cli_job``)."""
    verdicts = {r.verdict.verdict for r in results}
    if "error" in verdicts:
        return 2
    return 1 if "fail" in verdicts else 0
