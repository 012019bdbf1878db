"""One flat list of test cases from any results document: what JUnit XML and the Markdown summary share.

Three documents reach the CI renderers (``reports.junit``, ``reports.summary``):

* ``chaos run`` over the built-in workload (``chaos.run.results``): ``scenarios[]`` with
  ``id, checkpointer, verdict, oracles{name: {result, summary}}, replay, error, seconds``
  and, after a ``--budget``, a ``campaign`` entry with fault-point coverage;
* ``chaos run -- COMMAND`` (``chaos.run.jobresults``): the same ``scenarios[]`` (one per
  point, ``checkpointer: "job"``, plus ``outcome`` and ``summary``) and a ``job`` entry
  with points found / tried;
* ``chaos certify`` (``chaos.certify.certify``, ``kind: "certification"``): ``properties[]``
  (``status`` pass | fail | n/a), ``campaign[]`` (runner scenarios, ``oracles`` as
  ``{passed, summary}``), ``dcp[]``, ``cleanup_error`` and ``certified``.

:func:`cases` maps each to :class:`Case` rows; :func:`describe` gives the run's title and
the coverage / certification lines. Nothing here imports torch or the runner: job mode
calls it without either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.errors import ConfigError

OUTCOMES = ("pass", "fail", "error", "skipped")


@dataclass
class Case:
    """One test case: a scenario, a job's point or a certification property.

    ``outcome`` is the results schema's verdict (pass | fail | error | skipped);
    ``label`` the finer word where there is one (a job's ``hard_failure``, a property's
    ``n/a``); ``message`` one line (the failing oracles' summaries, the error's first
    line or the skip reason); ``details`` the lines of the failure text.
    """

    classname: str
    name: str
    outcome: str
    label: str
    message: str = ""
    failure_type: str = ""
    details: list[str] = field(default_factory=list)
    replay: str | None = None
    seconds: float = 0.0
    # (name, value) pairs of the case's own JUnit <properties>: a cause's point ids and their replays
    properties: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class RunInfo:
    """What a report says about the run as a whole."""

    kind: str  # run | job | certification
    title: str
    notes: list[str] = field(default_factory=list)  # coverage, tolerance mode, certified or not
    properties: dict[str, str] = field(default_factory=dict)  # JUnit <properties>
    seconds: float | None = None


# What a terminal or a Markdown renderer would act on rather than show: C0 and C1 controls and
# DEL (ESC]0;...BEL retitles a terminal, ESC[2J clears it, CR overprints a line), Unicode's
# bidirectional overrides (text that reads other than it runs) and lone surrogates (which
# cannot be encoded, so a print of them fails).
_OTHER_CONTROLS = "\\x7f-\\x9f\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069\\ud800-\\udfff"
_CONTROL = re.compile(f"[\\x00-\\x08\\x0a-\\x1f{_OTHER_CONTROLS}]")
_CONTROL_KEEP_NEWLINES = re.compile(f"[\\x00-\\x08\\x0b-\\x1f{_OTHER_CONTROLS}]")


def printable(text: Any, newlines: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\u001b``, ``\\u202e``, as JUnit's
    ``reports.junit._x`` writes them) instead of acted on.

    For everything printed or written as Markdown that did not come from the harness
    itself: ids, summaries, commands and errors read from a results file or a job's
    output. Tabs stay; newlines stay only with ``newlines`` (multi-line evidence).
    """
    pattern = _CONTROL_KEEP_NEWLINES if newlines else _CONTROL
    return pattern.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text))


def cut_words(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, ending in "…" when cut: at a word boundary where the
    last word starts in the last 40 % of the limit (a torch message ends "... If you are…", not
    "... If you are s…"), else mid-word (one long token). For table cells and one-line summaries;
    reports.causes keeps an exception's line whole."""
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    space = cut.rfind(" ")
    if not text[len(cut)].isspace() and space >= 0.6 * len(cut):
        cut = cut[:space]
    return cut.rstrip() + "…"


def one_line(text: Any, limit: int | None = None) -> str:
    """Whitespace (newlines included) folded to single spaces, control characters escaped (:func:`printable`);
    cut at ``limit`` characters, between words where it can be (:func:`cut_words`)."""
    flat = printable(re.sub(r"\s+", " ", str(text or "")).strip())
    return cut_words(flat, limit) if limit is not None else flat


def _strip_skipped(text: str) -> str:
    return text[len("skipped: "):] if text.startswith("skipped: ") else text


def _failed(o: Any) -> bool:
    if not isinstance(o, dict):
        return str(o) == "fail"
    if "passed" in o:
        return not o["passed"]
    return o.get("result") == "fail"


def _failing(oracles: Any) -> list[tuple[str, str]]:
    if not isinstance(oracles, dict):
        return []
    return [(str(n), one_line(o.get("summary") if isinstance(o, dict) else o)) for n, o in oracles.items()
            if _failed(o)]


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _fault_specs(faults: Any) -> str:
    out = []
    for f in faults or []:
        out.append(str(f.get("spec") or f.get("kind")) if isinstance(f, dict) else str(f))
    return " ".join(out)


def dotted_classname(spec: str) -> str:
    """A checkpointer spec as a JUnit ``classname``: dotted, as CI dashboards group them.

    Jenkins and GitLab split a classname at its last dot into package and class, so the
    spec of a checkpointer in a file (``tests/checkpointers/x.py:MyCkpt``) would show as
    class ``py:MyCkpt`` of package ``tests/checkpointers/x``. Such a spec becomes
    ``tests.checkpointers.x.MyCkpt``, a module spec (``pkg.mod:MyCkpt``) ``pkg.mod.MyCkpt``;
    built-in names (``reference``, ``dcp-async``) stay as they are. A file under the current
    directory is named relative to it (a run records the spec's absolute path), so the
    same checkpointer gets the same classname on every CI machine. The scenario's own
    ``checkpointer`` field, and its replay command, keep the spec verbatim.
    """
    module, sep, obj = spec.rpartition(":")
    if not sep or not module or not obj:
        return spec
    if module.endswith(".py"):
        module = module[:-3]
        here = os.getcwd()
        if os.path.isabs(module) and module.startswith(here + os.sep):
            module = os.path.relpath(module, here)  # the run resolves a relative spec against its cwd
    parts = [p for p in re.split(r"[\\/]+", module) if p and p != "."]
    dotted = ".".join(p.replace(".", "_") for p in parts[:-1])
    last = parts[-1] if parts else module
    return ".".join(x for x in (dotted, last, obj) if x)


def scenario_case(sc: dict[str, Any], classname: str | None = None, name: str | None = None) -> Case:
    """A results document's scenario (built-in, job point, or certify campaign entry) as a Case."""
    verdict = str(sc.get("verdict") or "error")
    outcome = verdict if verdict in OUTCOMES else "error"
    label = str(sc.get("outcome") or verdict)
    failing = _failing(sc.get("oracles"))
    error = one_line(sc.get("error"))
    replay = sc.get("replay") or None
    details = []
    if label != outcome:
        details.append(f"outcome: {label}")
    faults = _fault_specs(sc.get("faults"))
    if faults:
        details.append(f"faults: {faults}")
    message, failure_type = "", ""
    if outcome == "fail":
        message = "; ".join(f"{n}: {s}" for n, s in failing) or one_line(sc.get("summary")) or error
        failure_type = label if label != "fail" else (failing[0][0] if failing else "fail")
        details += [f"{n}: {s}" for n, s in failing]
        if error and not failing:
            details.append(error)
    elif outcome == "error":
        message = error or one_line(sc.get("summary")) or "harness error"
        failure_type = "harness_error"
        details.append(str(sc.get("error") or message))
    elif outcome == "skipped":
        message = _strip_skipped(error or one_line(sc.get("summary")) or "skipped")
    if outcome in ("fail", "error") and replay:
        details.append(f"replay: {replay}")
    return Case(classname=classname or dotted_classname(str(sc.get("checkpointer") or "chaos")),
                name=name or str(sc.get("id") or "?"),
                outcome=outcome, label=label, message=message, failure_type=failure_type, details=details,
                replay=replay, seconds=_seconds(sc.get("seconds")))


def _property_case(p: dict[str, Any], classname: str, prefix: str = "") -> Case:
    status = str(p.get("status") or "error")
    outcome = {"pass": "pass", "fail": "fail", "n/a": "skipped"}.get(status, "error")
    summary = one_line(p.get("summary"))
    details = [summary] if outcome in ("fail", "error") and summary else []
    return Case(classname=classname, name=f"{prefix}{p.get('name') or '?'}", outcome=outcome, label=status,
                message=summary if outcome != "pass" else "", failure_type=f"property_{status}" if details else "",
                details=details, seconds=_seconds(p.get("seconds")))


def _certification_cases(doc: dict[str, Any]) -> list[Case]:
    backend = str(doc.get("backend") or "backend")
    out = [_property_case(p, backend) for p in doc.get("properties") or [] if isinstance(p, dict)]
    for sc in doc.get("campaign") or []:
        if isinstance(sc, dict):
            out.append(scenario_case(sc, classname=backend, name=f"campaign: {sc.get('name') or sc.get('id') or '?'}"))
    for p in doc.get("dcp") or []:
        if isinstance(p, dict):
            out.append(_property_case(p, backend, prefix="dcp: "))
    if doc.get("cleanup_error"):
        msg = one_line(doc["cleanup_error"])
        out.append(Case(backend, "cleanup", "fail", "fail", msg, "cleanup", [msg]))
    # The exit status in one case: a partial run passes every case it ran but is never certified.
    verdict = bool(doc.get("certified"))
    word = certification_word(doc)
    reasons = ([f"failing: {', '.join(map(str, doc.get('failing') or []))}"] if doc.get("failing") else []) + (
        [f"not tested: {'; '.join(map(str, doc.get('not_tested') or []))}"] if doc.get("not_tested") else []) + (
        [str(doc["partial"])] if doc.get("partial") else [])
    why = one_line("; ".join(reasons) or "not certified")
    out.append(Case(backend, "certified", "pass" if verdict else "fail", "pass" if verdict else "fail",
                    "" if verdict else f"{word}: {why}", "" if verdict else "not_certified",
                    [] if verdict else [f"{word}: {why}"], seconds=0.0))
    return out


def certification_word(doc: dict[str, Any]) -> str:
    """CERTIFIED, NOT CERTIFIED or NOT TESTED (a scenario that tested nothing, and nothing failing),
    from ``certified``; a ``verdict`` field is believed only where it agrees with it."""
    if doc.get("certified") is True:
        return "CERTIFIED"
    return "NOT TESTED" if doc.get("verdict") == "NOT TESTED" and not doc.get("failing") else "NOT CERTIFIED"


def kind(doc: dict[str, Any]) -> str:
    if doc.get("kind") == "certification":
        return "certification"
    return "job" if isinstance(doc.get("job"), dict) else "run"


def check_document(doc: Any, source: str = "results document") -> dict[str, Any]:
    """ConfigError unless ``doc`` is one of the three documents (named by ``source``)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(doc).__name__}")
    if kind(doc) == "certification":
        if not isinstance(doc.get("properties"), list):
            raise ConfigError(f"{source}: a certification report needs a 'properties' list")
    elif not isinstance(doc.get("scenarios"), list):
        raise ConfigError(f"{source}: not a chaos results JSON: expected an object with a 'scenarios' list")
    return doc


def cases(doc: dict[str, Any]) -> list[Case]:
    """Every test case of a results document, in the document's order."""
    check_document(doc)
    if kind(doc) == "certification":
        return _certification_cases(doc)
    return [scenario_case(sc) for sc in doc["scenarios"] if isinstance(sc, dict)]


def _job_notes(job: dict[str, Any]) -> list[str]:
    notes = []
    cut = job.get("interrupted")
    if isinstance(cut, dict):  # chaos.run.explore.interrupt_record
        notes.append(one_line(f"interrupted after {cut.get('after', '?')} of {cut.get('of', '?')} points "
                              f"({cut.get('signal', '?')}): the points it cut short are not judged"))
    if "points_found" in job:
        notes.append(f"coverage: {job.get('points_tried', 0)} of {job['points_found']} point(s) tried "
                     f"({_seconds(job.get('coverage')):.0%})" + (
                         f" within a {job['budget_s']:g} s budget" if isinstance(job.get("budget_s"), int | float)
                         else ""))
    ref = job.get("reference") or {}
    if isinstance(ref, dict) and ref.get("tolerance_mode"):
        notes.append("tolerance mode: the fault-free runs differed, results were compared within a tolerance")
    return notes


def _campaign_notes(campaign: dict[str, Any]) -> list[str]:
    notes = [f"campaign: {campaign.get('family_scenarios', 0)} family scenario(s), {campaign.get('generated', 0)} "
             f"generated schedule(s), {campaign.get('generated_skipped', 0)} skipped"
             + (f" within a {campaign['budget_s']:g} s budget" if isinstance(campaign.get("budget_s"), int | float)
                else "")]
    cov = campaign.get("coverage")
    if isinstance(cov, dict):
        if cov.get("trace_error"):
            notes.append(f"fault-point coverage: none ({one_line(cov['trace_error'])})")
        else:
            notes.append(f"fault-point coverage: {cov.get('tried', 0)} of {cov.get('seen', 0)} (rank, operation, "
                         f"file role, phase) points tried; {cov.get('io_faults_fired', 0)} of "
                         f"{cov.get('io_faults_drawn', 0)} drawn I/O fault(s) fired")
    return notes


def describe(doc: dict[str, Any]) -> RunInfo:
    """Title, notes (coverage, certified or not) and suite properties of a results document."""
    check_document(doc)
    k = kind(doc)
    props = {str(key): str(v) for key, v in (doc.get("environment") or doc.get("host") or {}).items() if v is not None}
    if doc.get("schema_version") is not None:
        props["schema_version"] = str(doc["schema_version"])
    if k == "certification":
        certified = bool(doc.get("certified"))
        notes = [certification_word(doc) + (
            f": failing {', '.join(map(str, doc.get('failing') or []))}" if doc.get("failing") else "") + (
            f"; not tested: {'; '.join(map(str, doc.get('not_tested') or []))}" if doc.get("not_tested") else "")]
        if doc.get("partial"):
            notes.append(str(doc["partial"]))
        if doc.get("commit_protocol"):
            notes.append(f"commit protocol: {one_line(doc['commit_protocol'])}")
        t = doc.get("throughput")
        if isinstance(t, dict) and "save_mb_s" in t:
            notes.append(f"throughput: save {t['save_mb_s']} MB/s, verified load {t.get('load_mb_s')} MB/s")
        props.update({"backend": str(doc.get("backend")), "certified": str(certified).lower()})
        return RunInfo(k, f"chaos certify {doc.get('backend')}", notes, props, _seconds(doc.get("seconds")) or None)
    if k == "job":
        job = doc["job"]
        command = (job.get("spec") or {}).get("command") or []
        title = "chaos run -- " + " ".join(map(str, command)) if command else "chaos run (job)"
        for key in ("points_found", "points_tried", "coverage"):
            if key in job:
                props[f"job.{key}"] = str(job[key])
        return RunInfo(k, title, _job_notes(job), props, _seconds(job.get("seconds")) or None)
    notes = _campaign_notes(doc["campaign"]) if isinstance(doc.get("campaign"), dict) else []
    names = sorted({str(sc.get("checkpointer")) for sc in doc["scenarios"] if isinstance(sc, dict)})
    title = "chaos run" + (f": {', '.join(names)}" if names else "")
    return RunInfo(k, title, notes, props, None)


def counts(rows: list[Case]) -> dict[str, int]:
    return {o: sum(1 for c in rows if c.outcome == o) for o in OUTCOMES}


def check_output(path: str | None, flag: str) -> None:
    """Before a long run: ConfigError if ``path`` can never be written (it is a directory)."""
    if path and Path(path).is_dir():
        raise ConfigError(f"{flag} {path}: is a directory, expected a file path")
