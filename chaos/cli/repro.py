"""``chaos repro``'s two texts for one failing point of a job run: a reproduction script and an issue draft.

Called by ``chaos.cli.commands.repro`` with the results document ``chaos run [options] --
COMMAND --json`` wrote (``chaos.run.results.job_results_document``: ``job.spec`` and ``scenarios``, one per
point, as ``explore.PointResult.to_dict`` made them). Pure functions of that document,
except :func:`versions` (installed package versions) and :func:`job_script` (whether
the job's script exists), so the tests build both texts from a real run's results.

- :func:`find` picks the point: the first failing one, or the one asked for; anything
  else is a ``ConfigError`` naming the file and the failing ids.
- :func:`repro_script`: a standalone Python file that reruns exactly that point through
  the harness (the recorded spec's options, ``--seed``, ``--point``, COMMAND, in the
  recorded cwd — or beside the script with the copied job script) and exits 0 when the
  same outcome comes back, 1 when it does not, 2 when the point could not be run.
- :func:`issue_markdown`: an upstream issue draft (what was done, expected, observed,
  how to reproduce, versions, the trimmed output) with every local path replaced by a
  placeholder (:class:`Scrubber`): ``<out>``, ``<cwd>``, ``<venv>``, ``<home>``, ...
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError
from chaos.model.grammar import replay_point
from chaos.model.jobspec import JobSpec
from chaos.target.job.script import FRAMEWORKS, JobScript, installed, script_packages
from reports.cases import printable

# The frameworks of chaos/examples/frameworks/ (distribution names): listed when the job's
# imports cannot be read (no local script, ``python -m``), where they are installed.
OUTPUT_LINES = 40      # the trimmed output: the last lines of the failed attempt's output
EVIDENCE_LINES = 60    # each failed oracle's evidence, as JSON, at most this many lines
OUTCOME_WORDS = {"hard_failure": "hard failure", "silent_divergence": "silent divergence", "lost_work": "lost work"}
# What each oracle expects of a correct job, for the draft's "Expected" section.
EXPECTED = {
    "liveness": "After the fault the restarted job runs to completion: it resumes from its newest complete "
                "checkpoint (or starts over when none was complete) instead of failing.",
    "result_files": "The resumed run's result files equal those of an uninterrupted run.",
    "loss_continuity": "Every step's loss after the resume equals the uninterrupted run's: the resumed run "
                       "trains on exactly the state that was saved.",
    "durability": "The resume starts at or after the newest checkpoint that was complete when the job was "
                  "stopped: no finished work is lost.",
    "preemption_exit": "A job stopped by SIGTERM before it finished exits with a non-zero status, so a "
                       "supervisor (torchelastic, a Kubernetes Job, Slurm) restarts it.",
}


@dataclass(frozen=True)
class Finding:
    """One failing point of a job results document, with what the texts need of the rest."""

    source: str                  # the results file as given on the command line
    point: str                   # its id
    seed: int                    # the run's ``--seed`` (corruption and power-loss points derive theirs from it)
    outcome: str                 # hard_failure | silent_divergence | lost_work
    summary: str
    spec: JobSpec
    entry: dict[str, Any]        # the ``scenarios`` entry
    environment: dict[str, Any]  # the document's ``environment`` (python, torch, chaos, platform)

    def rerun_args(self) -> list[str]:
        """``chaos run`` options, ``--seed`` and ``--point`` that rerun exactly this point (COMMAND follows ``--``)."""
        return [*self.spec.replay_args(), "--seed", str(self.seed), "--point", self.point_arg]

    @property
    def point_arg(self) -> str:
        """What ``--point`` takes: the id with the anchor its run recorded (``spec.replay_point``)."""
        return replay_point(self.entry)

    def rerun_command(self) -> str:
        return shlex.join(["chaos", "run", *self.rerun_args(), "--", *self.spec.command])


def failing_ids(doc: dict[str, Any]) -> list[str]:
    return [str(s.get("id")) for s in doc.get("scenarios", []) if isinstance(s, dict) and s.get("verdict") == "fail"]


def find(doc: Any, source: str, point: str | None = None) -> Finding:
    """The point to reproduce: ``point``, or the first failing one. ConfigError (naming ``source``) when
    the document is no job results file, has no failing point, or ``point`` is unknown or did not fail."""
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise ConfigError(f"{source} is not a chaos results JSON: expected an object with a 'scenarios' list")
    job = doc.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("spec"), dict):
        raise ConfigError(f"{source} is not the results of a job run (chaos run [options] -- COMMAND --json): it "
                          "has no 'job' entry; chaos repro reproduces a job's failing point")
    failing = failing_ids(doc)
    listed = ", ".join(failing) if failing else "none"
    entries = [s for s in doc["scenarios"] if isinstance(s, dict)]
    if point is None:
        if not failing:
            counts = ", ".join(f"{n} {v}" for v, n in sorted(_count(entries).items())) or "no point"
            raise ConfigError(f"{source} has no failing point to reproduce ({counts})")
        point = failing[0]
    entry = next((s for s in entries if s.get("id") == point), None)
    if entry is None:
        raise ConfigError(f"{source} has no point {point}; its failing points: {listed}")
    if entry.get("verdict") != "fail":
        raise ConfigError(f"{source}: point {point} did not fail (verdict {entry.get('verdict')}, outcome "
                          f"{entry.get('outcome')}); its failing points: {listed}")
    try:
        spec = JobSpec.from_dict(job["spec"])
        seed = int(entry.get("seed") or 0)
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{source}: the recorded job spec is not one chaos run wrote ({why})") from None
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    return Finding(source, str(point), seed, str(entry.get("outcome") or "fail"), str(entry.get("summary") or ""),
                   spec, entry, env)


def _count(entries: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        out[str(e.get("verdict"))] = out.get(str(e.get("verdict")), 0) + 1
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _where(params: dict[str, Any]) -> str:
    """``its 4th `open` of `<out>/ckpt.json` (traced file event 10)``."""
    event, path, nth, op = params.get("event"), params.get("path"), params.get("nth"), params.get("op")
    what = f"`{event}`" if event else "file event"
    of = f" of `<out>/{path}`" if path and not str(path).startswith("/") else (f" of `{path}`" if path else "")
    count = f"{_ordinal(int(nth))} " if isinstance(nth, int) else ""
    ordinal = f" (traced file event {op})" if op is not None else ""
    return f"its {count}{what}{of}{ordinal}"


def _killed_at(who: str, params: dict[str, Any]) -> str:
    """``rank 0 was killed (SIGKILL) right after its `open` of ...``: a kill at a file event (a point's
    first fault, or a second one inside its restart)."""
    how = {"before": "just before", "after": "right after",
           "torn": "halfway through (a torn write: only the first half of its bytes reached the file)"}
    when = params.get("when")
    return f"{who} was killed (SIGKILL) {how.get(when, f'at ({when})')} {_where(params)}"


def describe_fault(finding: Finding) -> str:
    """The fault in words: what the harness did to the job at this point, then how it restarted it."""
    faults = finding.entry.get("faults") or [{}]
    f = faults[0] if isinstance(faults[0], dict) else {}
    params = f.get("params") or {}
    rank, kind, step = f.get("rank"), f.get("kind"), f.get("step")
    applied = finding.entry.get("fault_applied") or {}
    what = applied.get("what") if isinstance(applied, dict) else None
    who = f"rank {rank}" if finding.spec.world_size > 1 else "the job"
    when = params.get("when")
    if kind == "crash":
        done = _killed_at(who, params)
    elif kind == "kill":
        done = f"{who} was killed (SIGKILL) at training step {step}"
    elif kind == "term":
        grace = params.get("grace_s", finding.spec.grace_s)
        done = f"{who} got SIGTERM at training step {step} (SIGKILL after a {grace:g} s grace)"
        done += f": {what}" if what else ""
    elif kind == "corrupt":
        done = what or f"the file completed by {_where(params)} was corrupted at rest ({when})"
        stopped = (f"right after {_where(params)}" if params.get("at_step") is None else
                   f"once {who} announced training step {params['at_step']}, its save over")
        done = f"every process was stopped {stopped}, then at rest: {done}"
    elif kind == "powerloss":
        lost = what.split(": ", 1)[1] if what and what.startswith("power loss") and ": " in what else what
        done = (f"power was lost right after {_where(params)}: data and directory entries that were not "
                "fsynced were gone" + (f" ({lost})" if lost else ""))
    elif kind == "ioerror":
        done = what or f"{_where(params)} raised {str(when).upper()} instead of being performed"
    elif kind == "diskfull":
        size = params.get("size_bytes")
        done = what or f"the job's output directory was a {size}-byte disk (real ENOSPC when full)"
    elif kind == "netcut":
        done = _net_cut(finding, who, step, params, applied if isinstance(applied, dict) else {})
    elif kind == "stop":  # a hung process: the rest of the job ran on (chaos.nemesis.stop)
        at = f"at training step {step}" if step is not None else f"right after {_where(params)}"
        done = (f"{who} was frozen (SIGSTOP) {at}, where it hung while the rest of the job ran on; every "
                "process was SIGKILLed once nothing of the job could go on, it was silent, or a copy failed")
        done += f" ({what})" if what else ""
    else:
        done = what or f"fault {f.get('spec') or finding.point}"
    second = faults[1] if len(faults) > 1 and isinstance(faults[1], dict) and faults[1].get("attempt") else None
    restarts = finding.spec.max_restarts + (1 if second is not None else 0)
    restarted = ("torchrun's agent restarted the workers" if finding.spec.torchrun else
                 "Slurm restarted the job (its own requeue, as in production)" if kind == "sched" else
                 f"the harness restarted the job (at most {restarts} restart(s))")
    if second is not None:  # a second fault, inside that restart (chaos run --resume-points)
        p2 = dict(second.get("params") or {})
        fired = next((x for x in finding.entry.get("fired") or [] if isinstance(x, dict) and x.get("attempt")
                      and x.get("action") in ("kill", "halt")), None)  # a replayed point names no event: what fired does
        if fired is not None and not p2.get("event"):
            p2.update(event=fired.get("op"), path=fired.get("path"))
        who2 = f"rank {second.get('rank')}" if finding.spec.world_size > 1 else "the job"
        again = "its agent restarted the workers again" if finding.spec.torchrun else "restarted once more"
        struck = (f"power was lost right after {_where(p2)} of the restart's own trace: data and directory "
                  "entries not yet fsynced were gone" if second.get("kind") == "powerloss"
                  else f"{_killed_at(who2, p2)} of the restart's own trace")
        restarted += f"; inside that restart (its recovery), {struck}; then {again}"
    return f"{done}; then {restarted}"


# How a copy of the job ended during a network cut (``netcut.finish``'s ``ended``), for a reader upstream.
NET_ENDINGS = {"killed_after_hold": "was still running, blocked, when the hold ended and was killed (SIGKILL)",
               "timed_out": "was stopped at the attempt's time limit", "exited_0": "exited 0",
               "stopped": "was stopped by the harness once another rank had failed"}


def _net_ending(copy: dict[str, Any]) -> str:
    ended, rc = copy.get("ended"), copy.get("returncode")
    if ended in NET_ENDINGS:
        return NET_ENDINGS[ended]
    if ended == "raised":
        return f"raised `{copy.get('cause')}`"
    if ended == "signal" and isinstance(rc, int):
        return f"was killed by signal {-rc}"
    return f"exited {rc}"


def _net_cut(finding: Finding, who: str, step: Any, params: dict[str, Any], applied: dict[str, Any]) -> str:
    """A ``net`` point in words: whose link, where, for how long, how every rank ended, the link back up.

    ``params`` is the fault's (``op``/``event``/``path``/``nth`` of a cut after a file event,
    ``hold_s``), ``applied`` the launcher's record (``netcut.cut``/``finish``: ``copies``, ``up``);
    copy *i* of a ``--ranks N`` job is rank *i*.
    """
    hold = params.get("hold_s", applied.get("hold_s", finding.spec.net_hold_s))
    at = f"at training step {step}" if step is not None else f"right after {_where(params)}"
    done = (f"{who}'s network link was cut {at} and kept down for {float(hold):g} s while the job went on (every "
            "packet to or from that rank dropped, as with a pulled cable: each rank runs in a network namespace of "
            "its own)")
    copies = [c for c in applied.get("copies") or [] if isinstance(c, dict)]
    if copies:
        endings = [_net_ending(c) for c in copies]
        if len(set(endings)) == 1:
            done += f": {'every rank' if len(copies) > 1 else 'the job'} {endings[0]}"
        else:
            done += ": " + "; ".join(f"rank {c.get('copy')} {e}" for c, e in zip(copies, endings, strict=True))
    if "up" in applied:
        done += "; the link was back up before the restart"
    return done


def _fault_kind(finding: Finding) -> Any:
    faults = finding.entry.get("faults") or [{}]
    return faults[0].get("kind") if isinstance(faults[0], dict) else None


def _short_fault(finding: Finding) -> str:
    faults = finding.entry.get("faults") or [{}]
    f = faults[0] if isinstance(faults[0], dict) else {}
    p = f.get("params") or {}
    kind, when, event, path = f.get("kind"), p.get("when"), p.get("event"), p.get("path")
    target = f"{event} of {path}" if event and path else (event or path or f"event {p.get('op')}")
    return {"crash": f"a kill {({'before': 'just before', 'after': 'right after'}).get(when, 'in the middle of')} "
                     f"{target}",
            "kill": f"a kill at step {f.get('step')}", "term": f"SIGTERM at step {f.get('step')}",
            "corrupt": f"{when} of {path} at rest", "powerloss": f"a power loss after {target}",
            "ioerror": f"{str(when).upper()} on {target}",
            "netcut": f"a network cut at step {f.get('step')}" if f.get("step") is not None
                      else f"a network cut right after {target}",
            "diskfull": "a full disk",
            "stop": f"a hang at step {f.get('step')}" if f.get("step") is not None else f"a hang right after {target}",
            }.get(kind, finding.point)


def versions(finding: Finding, script: JobScript | None) -> list[tuple[str, str]]:
    """(name, version) lines of the draft: python, torch and chaos-ckpt as recorded by the run, the
    platform, then the third-party packages the job's script imports (installed versions), or, when
    its imports cannot be read, the frameworks of ``FRAMEWORKS`` that are installed."""
    env = finding.environment
    out = [("python", str(env.get("python") or sys.version.split()[0])),
           ("torch", str(env.get("torch") or installed("torch") or "not installed"))]
    if script is not None:
        extra = [(d, v) for d, v in script_packages(str(script.path)).items() if d != "torch"]
    else:
        extra = [(d, v) for d in FRAMEWORKS if (v := installed(d))]
    out += extra
    out.append(("chaos-ckpt (the harness)", str(env.get("chaos") or installed("chaos-ckpt") or "unknown")))
    if env.get("platform"):
        out.append(("platform", str(env["platform"])))
    return out


# A point's scratch folders (``.../chaos-job-*/point-N/out``): also read by chaos.cli.findings.scrub.
SCRATCH_RUN = re.compile(r"(?:/[^\s'\"`/<>]+)*/chaos-job-\w+/(?:point|golden)-\d+/(out|tmp|trace|logs)\b")
_SCRATCH = re.compile(r"(?:/[^\s'\"`/<>]+)*/chaos-(?:job|repro)-\w+")
# A leftover absolute path of two components or more (not part of a URL or of a placeholder).
_ABSOLUTE = re.compile(r"(?<![\w.~<>/:-])/(?:[^\s/'\"`<>()\[\],;:]+/)+[^\s/'\"`<>()\[\],;:]*")
SYSTEM_PREFIXES = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/", "/dev/", "/proc/", "/sys/")


@dataclass(frozen=True)
class Scrubber:
    """Replaces local paths in text by placeholders, so a draft can be posted as it is.

    In this order: a point's scratch folders (``.../chaos-job-*/point-N/out`` -> ``<out>``,
    ``tmp``, ``trace``, ``logs`` alike), the scratch root (``<scratch>``), then ``roots``
    longest first (cwd, venv, Python, home, temp dir: each only where it is a whole path
    prefix), then any absolute path that is still left outside the system directories
    (``<path>/NAME``: its last component only).
    """

    roots: tuple[tuple[str, str], ...]  # (absolute path, placeholder)

    @classmethod
    def for_finding(cls, finding: Finding, extra: tuple[tuple[str, str], ...] = ()) -> Scrubber:
        """The local roots of this run and this machine: the recorded cwd, the job's interpreter's venv,
        this Python's venv and installation, the chaos checkout, the home and temp directories."""
        pairs: list[tuple[str, str]] = [(finding.spec.cwd, "<cwd>"), *extra]
        exe = finding.spec.command[0] if finding.spec.command else ""
        if os.path.isabs(exe) and os.path.basename(os.path.dirname(exe)) in ("bin", "Scripts"):
            pairs.append((os.path.dirname(os.path.dirname(exe)), "<venv>"))
        if sys.prefix != sys.base_prefix:
            pairs.append((sys.prefix, "<venv>"))
        pairs += [(sys.base_prefix, "<python>"), (sys.base_exec_prefix, "<python>"),
                  (str(Path(__file__).resolve().parents[2]), "<chaos>"), (str(Path.home()), "<home>"),
                  (os.environ.get("HOME", ""), "<home>"), (tempfile.gettempdir(), "<tmp>")]
        roots: dict[str, str] = {}
        for path, name in pairs:
            for p in (path, os.path.realpath(path) if path else ""):
                p = p.rstrip("/")
                if p and p != "/" and p not in roots:
                    roots[p] = name
        return cls(tuple(sorted(roots.items(), key=lambda kv: -len(kv[0]))))

    def scrub(self, text: str) -> str:
        text = SCRATCH_RUN.sub(lambda m: f"<{m.group(1)}>", text)
        text = _SCRATCH.sub("<scratch>", text)
        for path, name in self.roots:
            text = re.sub(re.escape(path) + r"(?=$|[/\s'\"`:,;)\]}])", name, text)
        return _ABSOLUTE.sub(self._leftover, text)

    @staticmethod
    def _leftover(m: re.Match[str]) -> str:
        path = m.group(0)
        if path.startswith(SYSTEM_PREFIXES):
            return path
        return f"<path>/{os.path.basename(path.rstrip('/')) or '...'}"


def _tail(text: str, lines: int) -> str:
    got = text.rstrip("\n").splitlines()
    return "\n".join(got[-lines:])


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def job_name(finding: Finding, script: JobScript | None) -> str:
    if script is not None:
        return script.path.name
    cmd = finding.spec.command
    if len(cmd) > 2 and cmd[1] == "-m":
        return f"python -m {cmd[2]}"
    return os.path.basename(cmd[0])


def title(finding: Finding, script: JobScript | None, found: list[tuple[str, str]]) -> str:
    frameworks = [f"{n} {v}" for n, v in found if n in FRAMEWORKS]
    subject = frameworks[0] if frameworks else job_name(finding, script)
    if frameworks and script is not None:
        subject += f" ({script.path.name})"
    words = {"hard_failure": "resume fails", "silent_divergence": "resumed run silently diverges",
             "lost_work": "resume loses finished work"}.get(finding.outcome, finding.outcome)
    return f"{subject}: {words} after {_short_fault(finding)}"


def issue_markdown(finding: Finding, found: list[tuple[str, str]], scrubber: Scrubber,
                   script: JobScript | None = None, copied: str | None = None) -> str:
    """The upstream issue draft in Markdown, every local path scrubbed (``scrubber``)."""
    e, spec = finding.entry, finding.spec
    oracles = {n: o for n, o in (e.get("oracles") or {}).items() if isinstance(o, dict)}
    failed = [n for n, o in oracles.items() if o.get("result") == "fail"]
    launch = (f"{spec.world_size} rank(s) under torchrun" if spec.torchrun else
              f"{spec.ranks} rank(s) with torchrun's environment" if spec.ranks else "one process")
    cmd = shlex.join(spec.command).replace("'{out}'", "<out>").replace("{out}", "<out>")
    lines = [f"# {title(finding, script, found)}", "",
             "## What was done", "",
             f"The training job `{job_name(finding, script)}` ({launch}, command `{cmd}`, where `<out>` is its "
             "output directory) was run twice without faults as the reference, then once more with "
             + ("two faults, the second inside the restart the first caused:"
                if len(e.get("faults") or []) > 1 else "one fault:"),
             "", f"- {describe_fault(finding)}.", "",
             f"The fault is point `{finding.point}` of the chaos harness (seed {finding.seed}); the verdict is "
             f"**{OUTCOME_WORDS.get(finding.outcome, finding.outcome)}**.", "",
             "## Expected", ""]
    lines += [f"- {EXPECTED.get(n, f'The {n} check passes.')}" for n in failed or ["liveness"]]
    applied = e.get("fault_applied") if isinstance(e.get("fault_applied"), dict) else {}
    observed = finding.summary
    what = str(applied.get("what") or "")
    if what and observed.startswith(what + "; then "):  # "What was done" already says it
        observed = observed[len(what) + len("; then "):]
    observed = observed[:1].upper() + observed[1:]
    lines += ["", "## Observed", "", f"{observed}."]
    also = [n for n in failed if str(oracles[n].get("summary", "")) not in finding.summary]
    lines += ([""] if also else []) + [f"- `{n}`: {oracles[n].get('summary', '')}" for n in also]
    attempts = e.get("attempts") or []
    if attempts:
        lines += ["", "Attempts: " + "; ".join(f"{a.get('attempt')}: {a.get('outcome')}" for a in attempts
                                                if isinstance(a, dict)) + "."]
    lines += ["", "## How to reproduce", ""]
    if _fault_kind(finding) == "netcut":
        lines += ["The network cut needs root and iproute2 (`ip`): the harness starts each rank in a network "
                  "namespace of its own on a private bridge, and cuts the rank's link there.", ""]
    if copied:
        lines += [f"The job script `{copied}` and `repro.py` are attached. `python repro.py` reruns exactly this "
                  "point through the harness and exits 0 when the same outcome comes back:", ""]
    else:
        lines += ["`python repro.py` (attached) reruns exactly this point through the harness and exits 0 when "
                  "the same outcome comes back. The harness command it runs, in the job's directory:", ""]
    lines += [_fence(f"# with the chaos harness (chaos-ckpt) installed\ncd <cwd>\n{finding.rerun_command()}", "sh"), "",
              "## Versions", ""]
    lines += [f"- {n}: {v}" for n, v in found]
    liveness = oracles.get("liveness", {}).get("evidence")
    tail = liveness.get("output_tail") if isinstance(liveness, dict) else None
    lines += ["", "## Output (trimmed)", ""]
    if isinstance(tail, str) and tail.strip():
        lines += [f"The last lines of the failed attempt's output (at most {OUTPUT_LINES}):", "",
                  _fence(_tail(tail, OUTPUT_LINES))]
    else:
        lines += ["The job exited 0 after the restart: there is no failing output. The evidence of the failed "
                  "check(s):"]
        for n in failed:
            evidence = oracles[n].get("evidence") or {}
            lines += ["", f"`{n}`:", "", _fence(_tail(json.dumps(evidence, indent=1, default=str),
                                                      EVIDENCE_LINES), "json")]
    lines += ["", "---", "Found with the chaos harness for training checkpoints (`chaos run -- COMMAND`, job mode)."]
    # The job's output and the results' texts may hold terminal controls: shown as escapes, not kept.
    return printable(scrubber.scrub("\n".join(lines).rstrip() + "\n"), newlines=True)


# The script's text is fixed: every value from the results file (point, outcome, summary,
# COMMAND, cwd, file names) enters it as a Python literal made by repr(), never inside the
# docstring or a comment, so no value can end a string and become code.
REPRO_TEMPLATE = '''#!/usr/bin/env python3
"""Reproduce one chaos finding: the point POINT of the job JOB_NAME, recorded outcome EXPECTED.

Written by `chaos repro` from the results file SOURCE. It reruns exactly that point through
the chaos harness (`chaos run OPTIONS --seed SEED --point POINT -- COMMAND`, in the
directory CWD the job ran in) and compares the outcome with the recorded one.

    python repro.py [--here] [--scratch DIR] [--keep] [--json PATH]

--here runs the copy of the job script beside this file instead, in this folder (it is
used anyway when the recorded directory or script is gone). The harness (chaos-ckpt)
must be importable by this Python, or by the one that wrote this file.

Exit status: 0 the defect reproduced (the same outcome again), 1 it did not, 2 the
point could not be run.
"""

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

POINT = {point!r}
JOB_NAME = {name!r}
SOURCE = {source!r}
POINT_ARG = {point_arg!r}  # what --point takes: POINT and, where it has one, its anchor (fires at that event)
SEED = {seed!r}
EXPECTED = {outcome!r}
RECORDED_SUMMARY = {summary!r}
OPTIONS = {options!r}
COMMAND = {command!r}
CWD = {cwd!r}
JOB_SCRIPT = {script!r}  # (index in COMMAND, name of the copy beside this file), or None
HARNESS_PYTHON = {harness!r}
JOB_PYTHON = {job_python!r}  # what COMMAND's bare interpreter name resolved to where it ran, or None
HERE = os.path.dirname(os.path.abspath(__file__))


def harness_python():
    """This Python if it can import the harness, else the one that wrote this file, else None."""
    try:
        if importlib.util.find_spec("chaos.cli.job") is not None:
            return sys.executable
    except (ImportError, ValueError):
        pass
    return HARNESS_PYTHON if HARNESS_PYTHON and os.path.exists(HARNESS_PYTHON) else None


def job_command(here):
    """(cwd, COMMAND): as recorded, or with the copied script beside this file."""
    command = list(COMMAND)
    recorded = os.path.isdir(CWD) and (
        JOB_SCRIPT is None or os.path.isfile(os.path.join(CWD, COMMAND[JOB_SCRIPT[0]])))
    cwd = CWD
    if here or not recorded:
        copy = os.path.join(HERE, JOB_SCRIPT[1]) if JOB_SCRIPT else None
        if copy is None or not os.path.isfile(copy):
            sys.exit("repro: the job ran in %s, which (or whose script) is gone, and no copy of the job "
                     "script is beside this file" % CWD)
        if not here:
            print("repro: %s or its job script is gone: running the copy beside this file" % CWD)
        command[JOB_SCRIPT[0]] = copy
        cwd = HERE
    exe = command[0]
    if os.path.isabs(exe) and not os.path.exists(exe) and os.path.basename(exe).startswith("python"):
        print("repro: the recorded interpreter %s is not here: using %s" % (exe, sys.executable))
        command[0] = sys.executable
    elif (not os.path.isabs(exe) and JOB_PYTHON and os.path.exists(JOB_PYTHON)
          and shutil.which(exe) != JOB_PYTHON):
        # a bare `python` is whatever PATH says here: the job ran with (and its packages are in) JOB_PYTHON
        print("repro: %s here is %s; the job ran with %s: using that" % (exe, shutil.which(exe), JOB_PYTHON))
        command[0] = JOB_PYTHON
    return cwd, command


def main(argv=None):
    ap = argparse.ArgumentParser(description="Rerun chaos point " + POINT + " and check it fails again.")
    ap.add_argument("--here", action="store_true", help="run the copied job script, in this folder")
    ap.add_argument("--scratch", metavar="DIR", help="parent of the harness's scratch root (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch root for inspection")
    ap.add_argument("--json", metavar="PATH", help="keep the rerun's results JSON here")
    args = ap.parse_args(argv)
    python = harness_python()
    if python is None:
        print("repro: the chaos harness (chaos-ckpt) is not importable here; install it "
              "(pip install chaos-ckpt) or run this file with its Python", file=sys.stderr)
        return 2
    cwd, command = job_command(args.here)
    scratch = os.path.abspath(args.scratch) if args.scratch else None
    work = tempfile.mkdtemp(prefix="chaos-repro-", dir=scratch)
    try:
        results = os.path.abspath(args.json) if args.json else os.path.join(work, "results.json")
        run = [python, "-m", "chaos.cli.main", "run", *OPTIONS, "--seed", str(SEED), "--point", POINT_ARG,
               "--json", results, "--scratch", work, *(["--keep"] if args.keep else []), "--", *command]
        print("repro: in %s: chaos %s" % (cwd, shlex.join(run[3:])), flush=True)
        code = subprocess.run(run, cwd=cwd).returncode
        try:
            with open(results) as f:
                entry = next(s for s in json.load(f)["scenarios"] if s.get("id") == POINT)
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            print("repro: COULD NOT RUN %s: the harness exited %d without a verdict for it" % (POINT, code))
            return 2
    finally:
        if args.keep:
            print("repro: scratch kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    outcome, summary = entry.get("outcome"), entry.get("summary", "")
    if entry.get("verdict") == "skipped":
        print("repro: COULD NOT RUN %s here: the harness skipped it: %s" % (POINT, summary))
        return 2
    if outcome == EXPECTED:
        print("repro: REPRODUCED %s: %s again: %s" % (POINT, outcome, summary))
        return 0
    print("repro: NOT REPRODUCED %s: expected %s, got %s (%s): %s"
          % (POINT, EXPECTED, outcome, entry.get("verdict"), summary))
    print("repro: recorded: " + RECORDED_SUMMARY)
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''


def repro_script(finding: Finding, harness_python: str, script: JobScript | None = None,
                 copied: str | None = None) -> str:
    """The standalone reproduction script (its recorded command and cwd embedded; see REPRO_TEMPLATE)."""
    name = script.path.name if script is not None else job_name(finding, script)
    return REPRO_TEMPLATE.format(point=finding.point, point_arg=finding.point_arg, name=name, outcome=finding.outcome,
                                 source=Path(finding.source).name, seed=finding.seed,
                                 summary=finding.summary, options=[*finding.spec.replay_args()],
                                 command=list(finding.spec.command), cwd=finding.spec.cwd,
                                 script=(script.index, copied) if script is not None and copied else None,
                                 harness=harness_python, job_python=_bare_python(finding.spec.command))


def _bare_python(command: tuple[str, ...]) -> str | None:
    """Where a bare ``python`` / ``python3.11`` at the head of COMMAND resolves here (``chaos repro`` runs
    where ``chaos run`` did): the repro pins it, since PATH elsewhere may name a Python without the job's
    packages. None for an absolute path or another program."""
    import shutil

    exe = command[0] if command else ""
    if os.path.isabs(exe) or not re.fullmatch(r"python[0-9.]*", os.path.basename(exe)):
        return None
    found = shutil.which(exe)
    return os.path.abspath(found) if found else None  # not realpath: a venv's python is a link to the base one
