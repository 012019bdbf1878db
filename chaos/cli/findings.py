"""The findings table: what job explorations found in a framework, one row per (framework, ranks, family, verdict).

``chaos findings RESULTS.json...`` (``chaos.cli.commands.findings``) reads the results
documents ``chaos run --json PATH -- COMMAND`` wrote for job explorations and renders,
with :func:`render`, the Markdown table README's "Findings against the frameworks people
train with" shows: framework, version, ranks, fault family, verdict with its counts ("hard
failure (3 of 4 kill points)"), one example point with a short evidence line, what it
means for a user, the public issue, and whether the peer tool (ckpt-chaos) can test that
family at all. Every count, example and version comes from the documents; only the two
human columns (meaning, issue) and the framework names come from a small checked-in
annotations file (:func:`load_annotations`, default
``chaos/examples/frameworks/findings.json``), keyed by framework + family + verdict. A row
the file does not annotate says "no annotation", never a guess.

Grouping: a document's framework is the annotations' ``jobs`` entry whose script (and
arguments, for a variant such as ``--shuffle``) its COMMAND runs; its ranks the job's world
size. Documents of the same framework and ranks are merged (a point tried in two of them
counts once; a point whose outcome differs between them is listed under the table). In a
family, each failing outcome is a row; a family where every judged point passed is one
"held" row; a family whose points were all skipped is a "not tested" row.

Standard library only (and ``chaos.model.jobspec`` for point families): no torch import.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chaos
from chaos.errors import ConfigError
from chaos.judge.job import FAILURES
from chaos.model.jobspec import FAULT_KINDS
from reports.cases import cut_words, printable
from reports.summary import cell, code

DEFAULT_ANNOTATIONS = Path(chaos.__file__).resolve().parent / "examples" / "frameworks" / "findings.json"
# every --faults kind, and "resume": a point struck again inside its resume (--resume-points), its own row
FAMILIES = (*FAULT_KINDS, "resume")
FAMILY_WORDS = {"kill": "kill", "corrupt": "corruption at rest", "power": "power loss",
                "errno": "I/O error (ENOSPC / EIO)", "term": "SIGTERM", "diskfull": "disk full (real ENOSPC)",
                "net": "network cut", "node": "node loss", "stale": "stale copy of an older save",
                "swap": "two ranks' files swapped", "payload": "code planted in the checkpoint",
                "reorder": "writes reordered before a power cut", "sched": "Slurm requeue / preemption / node loss", "stop": "a hung process (SIGSTOP)",
                "restart": "a container restarted in place", "resume": "a second fault (a kill or a power cut) inside the resume after a first fault"}
VERDICT_WORDS = {"code_execution": "code execution", "hard_failure": "hard failure", "silent_divergence": "silent divergence", "lost_work": "lost work",
                 "pass": "held", "error": "harness error", "skipped": "not tested"}
PEER_ANSWERS = ("yes", "no", "partly")
EVIDENCE_LIMIT = 150  # characters of a point's evidence in its cell
NO_ANNOTATION = "no annotation"
# Any other path under a job exploration's scratch root (a point's {out} and {tmp}: chaos.cli.repro.SCRATCH_RUN).
_SCRATCH_ANY = re.compile(r"(?:/[^\s'\"`/<>]+)*/chaos-job-\w+(?:/[^\s'\"`<>]*)?")
_RESUME = re.compile(r"^the resume(?: copy \d+)? (?:exited|was|never|timed)[^:]*: ")


@dataclass(frozen=True)
class JobEntry:
    """An annotations ``jobs`` entry: the job whose COMMAND runs ``script`` with every one of ``args``."""

    script: str
    args: tuple[str, ...]
    framework: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class Note:
    """The human columns of the rows of ``framework`` ("*": any), ``family`` and ``verdict`` (at ``ranks``, if set)."""

    framework: str
    family: str
    verdict: str
    meaning: str
    issue: str
    ranks: int | None = None


@dataclass(frozen=True)
class Annotations:
    """The checked-in annotations: which framework a job is, what its findings mean, what the peer can test."""

    source: str
    jobs: tuple[JobEntry, ...]
    notes: tuple[Note, ...]
    peer: str
    peer_families: dict[str, str]
    peer_notes: dict[str, str]

    def job(self, command: list[str]) -> JobEntry | None:
        """The entry whose script COMMAND runs, the one with the most of its arguments matched (a variant)."""
        names = [Path(a).name for a in command]
        best: JobEntry | None = None
        for entry in self.jobs:
            if entry.script in names and all(a in command for a in entry.args):
                if best is None or len(entry.args) > len(best.args):
                    best = entry
        return best

    def note(self, framework: str, family: str, verdict: str, ranks: int) -> Note | None:
        """The most specific note: this framework before "*", a note for these ranks before one for any."""
        fits = [n for n in self.notes if n.family == family and n.verdict == verdict
                and n.framework in (framework, "*") and n.ranks in (None, ranks)]
        fits.sort(key=lambda n: (n.framework == "*", n.ranks is None))
        return fits[0] if fits else None


def _text(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{source}: {where} must be a non-empty string, got {value!r}")
    return value.strip()


def parse_annotations(doc: Any, source: str) -> Annotations:
    """Check and convert an annotations document; ConfigError naming ``source`` and the bad entry."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: an annotations file is a JSON object with 'jobs', 'notes' and 'peer'")
    jobs = []
    for i, j in enumerate(doc.get("jobs") or []):
        if not isinstance(j, dict):
            raise ConfigError(f"{source}: jobs[{i}] is not an object")
        args = j.get("args") or []
        pkgs = j.get("packages") or []
        if not all(isinstance(a, str) for a in args) or not all(isinstance(p, str) for p in pkgs):
            raise ConfigError(f"{source}: jobs[{i}]: 'args' and 'packages' are lists of strings")
        jobs.append(JobEntry(_text(j.get("script"), f"jobs[{i}].script", source), tuple(args),
                             _text(j.get("framework"), f"jobs[{i}].framework", source), tuple(pkgs)))
    notes = []
    for i, n in enumerate(doc.get("notes") or []):
        if not isinstance(n, dict):
            raise ConfigError(f"{source}: notes[{i}] is not an object")
        family = _text(n.get("family"), f"notes[{i}].family", source)
        if family not in FAMILIES:
            raise ConfigError(f"{source}: notes[{i}].family {family!r}: choose from {', '.join(FAMILIES)}")
        verdict = _text(n.get("verdict"), f"notes[{i}].verdict", source)
        verdict = "pass" if verdict == "held" else verdict
        if verdict not in (*FAILURES, "pass"):
            raise ConfigError(f"{source}: notes[{i}].verdict {verdict!r}: choose from "
                              f"{', '.join(FAILURES)}, held")
        ranks = n.get("ranks")
        if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1):
            raise ConfigError(f"{source}: notes[{i}].ranks must be a positive integer, got {ranks!r}")
        notes.append(Note(_text(n.get("framework"), f"notes[{i}].framework", source), family, verdict,
                          _text(n.get("meaning"), f"notes[{i}].meaning", source),
                          _text(n.get("issue"), f"notes[{i}].issue", source), ranks))
    peer = doc.get("peer") or {}
    if not isinstance(peer, dict) or not isinstance(peer.get("families", {}), dict):
        raise ConfigError(f"{source}: 'peer' is an object with 'tool' and 'families' (family -> yes / no / partly)")
    families = {}
    for fam, answer in (peer.get("families") or {}).items():
        if fam not in FAMILIES or answer not in PEER_ANSWERS:
            raise ConfigError(f"{source}: peer.families[{fam!r}] = {answer!r}: a family of {', '.join(FAMILIES)} "
                              f"and one of {', '.join(PEER_ANSWERS)}")
        families[fam] = answer
    peer_notes = peer.get("notes") or {}
    if not isinstance(peer_notes, dict) or not all(isinstance(v, str) for v in peer_notes.values()):
        raise ConfigError(f"{source}: peer.notes maps a family to a string")
    return Annotations(source, tuple(jobs), tuple(notes), str(peer.get("tool") or "the peer tool"), families,
                       dict(peer_notes))


def load_annotations(path: str | Path | None = None) -> Annotations:
    """The annotations file at ``path`` (default :data:`DEFAULT_ANNOTATIONS`); ConfigError when unreadable or bad."""
    from reports.jsonfile import read_json

    p = Path(path) if path is not None else DEFAULT_ANNOTATIONS
    return parse_annotations(read_json(p, "annotations"), str(p))


@dataclass(frozen=True)
class PointOutcome:
    """One tried point of a results document, as the table needs it."""

    id: str
    family: str
    verdict: str   # pass | fail | error | skipped
    outcome: str   # pass | hard_failure | silent_divergence | lost_work | no_effect | not_reached | ...
    summary: str
    replay: str
    source: str

    @property
    def key(self) -> str:
        """What the point counts as in its family: a failing outcome, ``pass``, ``skipped`` or ``error``."""
        if self.verdict in ("skipped", "error"):
            return self.verdict
        return self.outcome if self.outcome in FAILURES else "pass"


@dataclass
class Run:
    """One results document: which job it explored (framework, ranks), with what, and its points."""

    source: str
    framework: str
    entry: JobEntry | None  # the annotations' jobs entry (None: named after its script)
    ranks: int
    command: str
    versions: dict[str, str]
    torch: str | None
    python: str | None
    found: int | None
    tried: int
    seconds: float | None
    families_found: dict[str, int]
    notes: list[str]
    points: list[PointOutcome] = field(default_factory=list)


def point_family(point_id: str, source: str) -> str:
    """The ``--faults`` family of a point id (``rank0:op9:power:s2`` -> power), as the harness parses it;
    ``resume`` for one with a second fault inside its resume (``...+rank0:op1:after``)."""
    from chaos.model.grammar import parse_point

    try:
        point = parse_point(point_id)
        return "resume" if point.then is not None else point.family
    except (ConfigError, ValueError):  # ValueError: a number of more digits than int() takes
        raise ConfigError(f"{source}: scenario {point_id[:200]!r} is not a point id chaos run writes") from None


def read_run(doc: Any, source: str, annotations: Annotations) -> Run:
    """A job results document as a :class:`Run`; ConfigError naming ``source`` when it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise ConfigError(f"{source} is not a chaos results JSON: expected an object with a 'scenarios' list")
    job = doc.get("job")
    spec = job.get("spec") if isinstance(job, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), list):
        raise ConfigError(f"{source} is not the results of a job run (chaos run [options] --json PATH -- COMMAND): "
                          "it has no 'job' entry with the job's command")
    command = [str(a) for a in spec["command"]]
    entry = annotations.job(command)
    script = next((Path(a).name for a in command if a.endswith(".py")), command[0] if command else "?")
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    packages = env.get("packages")
    versions = {str(k): str(v) for k, v in packages.items()} if isinstance(packages, dict) else {}
    ranks = spec.get("world_size") or 1
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ConfigError(f"{source}: job.spec.world_size must be a positive integer, got {ranks!r}")
    found = job.get("points_found")
    found_by = (job.get("faults") or {}).get("found") if isinstance(job.get("faults"), dict) else None
    ref = job.get("reference") if isinstance(job.get("reference"), dict) else {}
    run = Run(source, entry.framework if entry else script, entry, ranks, " ".join(command), versions,
              env.get("torch"), env.get("python"), found if isinstance(found, int) else None, 0,
              job.get("seconds") if isinstance(job.get("seconds"), (int, float)) else None,
              dict(found_by) if isinstance(found_by, dict) else {}, [str(n) for n in ref.get("notes") or [] if isinstance(ref.get("notes"), list)])
    if not isinstance(packages, dict):
        run.notes.append("the results do not record the job's package versions (no environment.packages: written "
                         "by a chaos that did not record them)")
    for i, s in enumerate(doc["scenarios"]):
        if not isinstance(s, dict):
            raise ConfigError(f"{source}: scenarios[{i}] is not an object")
        pid, verdict = s.get("id"), s.get("verdict")
        if not isinstance(pid, str) or not pid:
            raise ConfigError(f"{source}: scenarios[{i}] has no 'id'")
        if verdict not in ("pass", "fail", "error", "skipped"):
            raise ConfigError(f"{source}: scenario {pid} has verdict {verdict!r}, not pass / fail / error / skipped")
        outcome = s.get("outcome") or verdict
        if verdict == "fail" and outcome not in FAILURES:
            raise ConfigError(f"{source}: scenario {pid} failed with outcome {outcome!r}, not one of "
                              f"{', '.join(FAILURES)}")
        run.points.append(PointOutcome(pid, point_family(pid, source), verdict, str(outcome),
                                       str(s.get("summary") or s.get("error") or ""), str(s.get("replay") or ""),
                                       source))
    run.tried = len(run.points)
    return run


def scrub(text: str) -> str:
    """A point's summary without the scratch root's paths: ``{out}/...``, ``{tmp}/...``, ``<scratch>``."""
    from chaos.cli.repro import SCRATCH_RUN

    text = SCRATCH_RUN.sub(lambda m: f"{{{m.group(1)}}}" if m.group(1) in ("out", "tmp") else m.group(0), text)
    return _SCRATCH_ANY.sub("<scratch>", text)


def evidence(point: PointOutcome, limit: int = EVIDENCE_LIMIT) -> str:
    """The short line a row shows for its example: for a failure what came back ("resume: ValueError:
    ..."), for a pass or a skip what the fault did, scrubbed of scratch paths and cut at ``limit``
    (between words where it can be: ``reports.cases.cut_words``)."""
    text = scrub(point.summary)
    if point.key in FAILURES and "; then " in text:
        text = text.split("; then ", 1)[1]
    elif point.key in ("pass", "skipped") and "; then " in text:
        text = text.split("; then ", 1)[0]
    text = _RESUME.sub("resume: ", text)
    return cut_words(text, limit)


@dataclass
class Row:
    """One line of the table."""

    framework: str
    versions: str
    ranks: int
    family: str
    key: str         # a failing outcome, pass (held), skipped (not tested), error
    count: int       # points with this key
    judged: int      # points of the family that were judged (neither skipped nor errored)
    skipped: int
    total: int       # every point of the family tried
    example: PointOutcome
    note: Note | None
    peer: str

    def verdict(self) -> str:
        """``hard failure (3 of 4 kill points)``; ``held (6 of 6 power points)``; ``not tested (...)``."""
        def points(n: int) -> str:
            return f"{self.family} point{'' if n == 1 else 's'}"

        if self.key == "skipped":
            return f"not tested ({self.count} {points(self.count)}, every one skipped: {self.example.outcome})"
        if self.key == "error":
            return f"harness error ({self.count} of {self.total} {points(self.total)})"
        skipped = f"; {self.skipped} more skipped" if self.skipped else ""
        return f"{VERDICT_WORDS[self.key]} ({self.count} of {self.judged} {points(self.judged)}{skipped})"


@dataclass
class Findings:
    """Everything :func:`render` shows: the rows, the runs behind them, points that disagreed between runs."""

    rows: list[Row]
    runs: list[Run]
    conflicts: list[str]
    annotations: Annotations


def _versions(runs: list[Run]) -> str:
    """``transformers 5.24.0`` from the runs' recorded packages (the framework's, as its jobs entry lists them)."""
    seen: dict[str, list[str]] = {}
    for run in runs:
        entry = run.entry
        wanted = list(entry.packages) if entry and entry.packages else [p for p in run.versions if p != "torch"]
        for pkg in wanted or ["torch"]:
            version = run.versions.get(pkg) or (run.torch if pkg == "torch" else None) or "not recorded"
            if version not in seen.setdefault(pkg, []):
                seen[pkg].append(version)
    return ", ".join(f"{pkg} {' / '.join(vs)}" for pkg, vs in seen.items())


def build(runs: list[Run], annotations: Annotations) -> Findings:
    """Group the runs' points into rows: per (framework, ranks, family), one row per failing outcome, else held."""
    order = {e.framework: i for i, e in enumerate(annotations.jobs)}
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.framework, run.ranks), []).append(run)
    rows: list[Row] = []
    conflicts: list[str] = []
    for (framework, ranks), members in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)),
                                                                               kv[0][0], kv[0][1])):
        points: dict[str, PointOutcome] = {}
        for run in members:
            for p in run.points:
                first = points.setdefault(p.id, p)
                if first is not p and first.key != p.key:
                    conflicts.append(f"{framework}, {ranks} rank(s), {p.id}: {first.key} in {first.source}, "
                                     f"{p.key} in {p.source}")
        versions = _versions(members)
        by_family: dict[str, list[PointOutcome]] = {}
        for p in points.values():
            by_family.setdefault(p.family, []).append(p)
        for family in FAMILIES:
            pts = by_family.get(family)
            if not pts:
                continue
            keys = Counter(p.key for p in pts)
            judged = len(pts) - keys["skipped"] - keys["error"]
            shown = [k for k in (*FAILURES, "error") if keys[k]]
            if not shown:
                shown = ["pass"] if judged else ["skipped"]
            for key in shown:
                # The first such point, preferring one whose summary says what the fault did ("...; then ...").
                same = [p for p in pts if p.key == key]
                example = next((p for p in same if "; then " in p.summary), same[0])
                note = annotations.note(framework, family, key, ranks) if key in (*FAILURES, "pass") else None
                rows.append(Row(framework, versions, ranks, family, key, keys[key], judged, keys["skipped"],
                                len(pts), example, note, annotations.peer_families.get(family, "unknown")))
    return Findings(rows, runs, conflicts, annotations)


def _human(text: str) -> str:
    """An annotation's Markdown as one table cell: one line, ``|`` escaped (its code spans kept), control
    characters shown as escapes (``reports.cases.printable``)."""
    return printable(re.sub(r"\s+", " ", text).strip().replace("|", "\\|"))


def render(found: Findings) -> str:
    """The Markdown: the table, the peer's reach per framework, the examples' replay commands, the runs."""
    ann = found.annotations
    lines = ["| framework | version | ranks | fault family | verdict | example point: evidence "
             f"| what it means for a user | public issue | {cell(ann.peer)} can test |",
             "|---|---|---:|---|---|---|---|---|---|"]
    for r in found.rows:
        example = f"{code(r.example.id)}: {cell(evidence(r.example))}"
        meaning = _human(r.note.meaning) if r.note else NO_ANNOTATION
        issue = _human(r.note.issue) if r.note else NO_ANNOTATION
        verdict = cell(r.verdict(), None)  # a skipped row names the points' recorded outcome
        if r.key in FAILURES:
            verdict = f"**{verdict}**"
        lines.append(f"| {cell(r.framework)} | {cell(r.versions)} | {r.ranks} | {cell(FAMILY_WORDS.get(r.family, r.family))} | "
                     f"{verdict} | {example} | {meaning} | {issue} | {r.peer} |")
    lines += ["", *_peer_section(found), "", "Replay an example (from the directory the runs ran in):", ""]
    seen: set[tuple[str, str]] = set()
    for r in found.rows:
        if r.key in FAILURES and r.example.replay and (r.example.id, r.example.replay) not in seen:
            seen.add((r.example.id, r.example.replay))
            lines.append(f"- {cell(r.framework)}, {r.ranks} rank(s), {FAMILY_WORDS.get(r.family, r.family)}, "
                         f"{VERDICT_WORDS[r.key]}: {code(r.example.replay)}")
    if not seen:
        lines.append("- (no failing point)")
    lines += ["", "Runs behind the table:", ""]
    for run in found.runs:
        families = cell(", ".join(f"{n} {k}" for k, n in run.families_found.items()), None) or "?"
        tried = Counter(p.key for p in run.points)
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(tried.items(), key=lambda kv: -kv[1]))
        took = f", {run.seconds:.0f} s" if run.seconds is not None else ""
        notes = f"; {cell('; '.join(run.notes), 400)}" if run.notes else ""
        unknown = "" if run.entry else f" (not in {cell(Path(ann.source).name)}'s jobs: named after its script)"
        lines.append(f"- {cell(Path(run.source).name)}: {cell(run.framework)}{unknown}, {run.ranks} rank(s), "
                     f"{code(run.command)}; {run.found if run.found is not None else '?'} points found "
                     f"({families}), {run.tried} tried: {outcomes or 'none'}{took}; "
                     f"torch {cell(run.torch or 'not recorded')}{notes}")
    if found.conflicts:
        lines += ["", "Points whose outcome differed between runs (counted once, as first seen):", ""]
        lines += [f"- {cell(c)}" for c in found.conflicts]
    return "\n".join(lines) + "\n"


def _peer_section(found: Findings) -> list[str]:
    """Per framework, its findings in families the peer cannot fully test, or that it held there (issue 16)."""
    ann = found.annotations
    out = [f"Families {cell(ann.peer)} cannot test (or only partly), per framework:", ""]
    frameworks: dict[str, list[Row]] = {}
    for r in found.rows:
        frameworks.setdefault(r.framework, []).append(r)
    for framework, rows in frameworks.items():
        beyond = [r for r in rows if r.peer in ("no", "partly")]
        bad = [r for r in beyond if r.key in FAILURES]
        held = [r for r in beyond if r.key == "pass"]
        if bad:
            what = "; ".join(f"{FAMILY_WORDS.get(r.family, r.family)}: {VERDICT_WORDS[r.key]} ({r.count} of {r.judged}, "
                             f"{r.ranks} rank(s))" for r in bad)
            out.append(f"- {cell(framework)}: {cell(what, None)}")
        elif held:
            what = "; ".join(f"{FAMILY_WORDS.get(r.family, r.family)} ({r.judged} point(s), {r.ranks} rank(s))" for r in held)
            out.append(f"- {cell(framework)}: held in every such family tried: {cell(what, None)}")
        else:
            out.append(f"- {cell(framework)}: no point tried in such a family")
    for fam, why in ann.peer_notes.items():
        out.append(f"- {cell(ann.peer)}, {cell(FAMILY_WORDS.get(fam, fam), None)}: {_human(why)}")
    return out
