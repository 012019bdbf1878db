"""The results JSON every consumer reads (CI, reports, replay): one object per run.

Its shape is ``chaos.model.resultschema.SCHEMA``; ``origin`` (``resultschema.origin_record``)
lets ``chaos replay`` tell a file this user wrote on this host from one that came from
elsewhere.
"""

from __future__ import annotations

import platform
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from chaos import __version__
from chaos.model.resultschema import origin_record
from chaos.run.runner import ScenarioResult
from reports.jsonfile import write_json_atomic

SCHEMA_VERSION = 1
VERDICTS = ("pass", "fail", "error", "skipped")


def results_document(results: list[ScenarioResult], campaign: dict[str, Any] | None = None) -> dict[str, Any]:
    """The document; ``campaign`` (generated schedules, skips, fault-point coverage) when a budget ran."""
    counts = Counter(r.verdict for r in results)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "summary": {v: counts.get(v, 0) for v in VERDICTS} | {"total": len(results)},
        "environment": {"chaos": __version__, "torch": metadata.version("torch"),
                        "python": platform.python_version(), "platform": platform.platform()},
        "scenarios": [r.to_dict() for r in results],
    }
    if campaign is not None:
        doc["campaign"] = campaign
    origin = origin_record(doc)
    if origin is not None:
        doc["origin"] = origin
    return doc


def write_results(path: str | Path, results: list[ScenarioResult], campaign: dict[str, Any] | None = None) -> None:
    """Write atomically, so a reader never sees half a results file."""
    write_json_atomic(path, results_document(results, campaign), indent=1)


def exit_status(results: list[ScenarioResult]) -> int:
    """0 all pass (or skipped), 1 any fail, 2 any harness error (results not trustworthy)."""
    verdicts = {r.verdict for r in results}
    if "error" in verdicts:
        return 2
    return 1 if "fail" in verdicts else 0
