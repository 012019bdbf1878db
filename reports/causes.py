"""A job run's failing points grouped by cause: one block per defect, with what fixes it.

A careless job fails dozens of points for one defect: every kill, ENOSPC and power cut
that lands while ``ckpt.pt`` is being rewritten in place fails the resume the same way.
Listing each point buries that one defect under near-identical blocks, so the reports
group them here, from what the results document (``chaos.run.jobresults``) already records
for each point — nothing is rerun and no new field is needed:

* **where the fault landed**: the fault record (``faults[0]``: family, mode, the event and
  the file under ``{out}``), and for a power cut the ``fault_applied.lost`` entries that
  explain the failure (the data of a file not fsynced, or a directory entry — its create,
  rename or unlink — lost because the directory was not fsynced);
* **the outcome** (hard_failure, silent_divergence, lost_work);
* **a signature**: the exception of the resume's last line (read whole from the liveness
  evidence's ``output_tail``: the verdict line cuts it at 200 characters), with numbers,
  scratch paths and hex normalised. A parser's message (``JSONDecodeError: Expecting value:
  line 1 column 1``, ``UnpicklingError``, ``EOFError``) says where in the bytes it gave up,
  which varies with where the file was torn (and whether ``UnicodeDecodeError`` fires
  before ``JSONDecodeError`` with which byte broke), so every parser's error is one key,
  :data:`PARSE_ERROR`; any other exception is keyed by its type and its message up to the
  first ``": "`` (``RuntimeError: PytorchStreamReader failed reading zip archive``). Each
  cause still lists every distinct normalised line it saw, with counts.

From the family, the event, the outcome and what is known about the file (written in
place: opened for writing more than once and never the target of a rename, as the
document's own points show) each point gets a *kind* — ``in_place``, ``dir_not_fsynced``,
``no_checksum``, ... — and :data:`KINDS` says in one line what each kind means and what
fixes it. Points with the same outcome, kind, file (digits normalised: the same file of
another save), detail and signature are one :class:`Cause`. A kind not in the table gets
no invented fix (:data:`NO_FIX`).

Callers: ``reports.junit`` (:func:`grouped_cases`: one testcase per cause),
``reports.summary`` (the cause table and its details), ``reports.html`` (the "Failures by
cause" section) and, for a terminal, :func:`console_lines` (the blocks the job CLI's end of
run prints after its counts line). Only job documents are grouped: a built-in run's
scenarios are each a generated schedule with its own oracles, and certification properties
are checks, not points. Standard library only: job mode imports it without torch.
Every string taken from the document is shown through ``reports.cases.printable`` (or
autoescaped by the HTML template, or escaped by the JUnit and Markdown writers).
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reports.cases import Case, check_document, dotted_classname, printable, scenario_case
from reports.cases import cases as point_cases

OUTCOME_ORDER = ("code_execution", "hard_failure", "silent_divergence", "lost_work")  # chaos.judge.job.FAILURES
# chaos.model.jobspec.Point.to_fault's ``kind`` -> the family a user names with --faults
FAMILY = {"crash": "kill", "kill": "kill", "corrupt": "corrupt", "powerloss": "power", "ioerror": "errno",
          "term": "term", "diskfull": "diskfull", "netcut": "net", "node_loss": "node", "stale": "stale",
          "swap": "swap", "payload": "payload", "reorder": "reorder", "sched": "sched",
          "rendezvous_host_loss": "node", "node_link_cut": "node", "stop": "stop", "restart": "restart",
          # a built-in fault run as a job's point (Point.builtin): its own kind
          "shortwrite": "kill", "eio": "errno", "enospc": "errno", "fsyncfail": "errno", "slowio": "errno",
          "bitflip": "corrupt", "truncate": "corrupt", "zero": "corrupt", "delete": "corrupt"}
# Which family's point best shows a cause: a plain kill replays with nothing else going on.
REPRESENTATIVE_ORDER = ("kill", "errno", "term", "diskfull", "power", "reorder", "corrupt", "stale", "swap", "payload",
                        "net", "node", "sched", "stop", "restart")
FAMILY_ORDER = ("kill", "corrupt", "power", "errno", "term", "diskfull", "net", "node", "sched", "stop", "restart")  # as chaos.model.jobspec lists them
POINTS_SHOWN = 8  # point ids a console block lists before "and N more"
NO_FIX = "no fix known for this kind: see the representative's evidence"


@dataclass(frozen=True)
class Kind:
    """What a kind of cause is (``title``, with ``{file}`` and ``{detail}``) and what fixes it."""

    title: str
    fix: str | None


KINDS: dict[str, Kind] = {
    "in_place": Kind("{file} is written in place",
                     "a kill or power cut mid-write leaves it torn — write a temp file, fsync it, rename it over, "
                     "fsync the directory"),
    "incomplete_loaded": Kind("the resume loads {file} from a save that never finished",
                              "a checkpoint is used before it is complete — publish it last (a temp file or directory "
                              "renamed into place after an fsync, or a commit marker written last) and fall back to "
                              "the previous one"),
    "data_not_fsynced": Kind("the data of {file} is not fsynced",
                             "a power cut leaves it empty, torn or older than the save that was trusted — fsync the "
                             "file before renaming it into place and before acknowledging the save"),
    "dir_not_fsynced": Kind("no fsync of the directory: the {detail} of {file} can be lost",
                            "a power cut can erase a completed save — fsync the directory after creating, renaming "
                            "or deleting a checkpoint in it, before acknowledging the save"),
    "corrupt_fatal": Kind("a damaged or missing {file} stops every restart",
                          "nothing detects the damage or falls back — store a hash with each checkpoint, verify it "
                          "on load and fall back to the previous checkpoint"),
    "no_checksum": Kind("no checksum on {file}",
                        "bit rot loads as good — store a hash and verify on load, fall back to the previous "
                        "checkpoint"),
    "no_fallback": Kind("a damaged or missing {file} loses the work it held",
                        "there is no older checkpoint to fall back to — keep the previous checkpoint until the new "
                        "one is verified, and fall back to it"),
    "unpickles_checkpoint": Kind("loading {file} runs code planted in it",
                                 "the checkpoint is unpickled with code execution allowed — load with "
                                 "torch.load(weights_only=True), or store tensors in safetensors and the rest in "
                                 "JSON; never pickle.load a file others can write"),
    "stale_accepted": Kind("an older copy of {file} loads as the newest",
                           "nothing ties the file to its save — record each file's hash (and step) in the "
                           "checkpoint's manifest, verify on load and fall back"),
    "swap_accepted": Kind("another rank's {file} loads as this rank's",
                          "nothing ties the file to its rank — record the rank and hash of each shard in the "
                          "manifest and verify on load"),
    "torn_accepted": Kind("after a power cut a torn or stale {file} loads as good",
                          "fsync it before the save is trusted, and store a hash to verify on load"),
    "reorder_accepted": Kind("{file}'s writes reaching the disk out of order load as good",
                             "an un-fsynced file can keep a later write and lose an earlier one (its index without "
                             "its data) — fsync it before it is trusted, and store a hash to verify on load"),
    "ignores_newest": Kind("the resume ignores the newest complete checkpoint",
                           "saved work is redone — resume from the newest checkpoint that is complete and verifies, "
                           "not from a fixed name or from scratch"),
    "recovery_unsafe": Kind("a crash inside the resume's own recovery loses work the first crash left intact",
                            "the recovery is not crash-safe — never remove or overwrite a checkpoint before its "
                            "replacement is durable (a temp file, fsync, rename, directory fsync); a restart must "
                            "survive a kill anywhere, as a save must"),
    "recovery_not_durable": Kind("a power cut inside the resume's own recovery loses {file}, which the first crash "
                                 "left intact",
                                 "the recovery rewrites a checkpoint without making it durable — fsync the new file "
                                 "before it replaces the old one (then the directory), or leave the old one alone; a "
                                 "restart must survive a power cut anywhere, as a save must"),
    "errno_swallowed": Kind("an I/O error ({detail}) in the save of {file} is not handled",
                            "the save counts as done though it failed — check every write, fsync and close, and fail "
                            "or retry the save"),
    "state_missing": Kind("the resumed run differs from an uninterrupted one",
                          "the checkpoint misses state the run needs — save and restore the RNG states, the "
                          "data-loader position, the LR scheduler and the optimizer with the model"),
    "commit_past_hung_rank": Kind("the checkpoint is committed while a hung rank's {file} is unfinished",
                                  "one rank's commit does not wait for every rank's part to be complete — commit "
                                  "only once each rank has reported its files fsynced (a barrier or an "
                                  "acknowledgement after the fsync, or each shard's hash in the manifest), never "
                                  "because a file exists"),
    "term_exit0": Kind("a SIGTERMed job exits 0 before its last step",
                       "no supervisor restarts a job that exited 0 — on SIGTERM save, then exit non-zero (143)"),
}
_OUTCOME_WORDS = {"code_execution": "loading the checkpoint runs code planted in it",
                  "hard_failure": "the resume fails", "silent_divergence": "the resumed run diverges",
                  "lost_work": "the resume loses work"}
_FAMILY_WORDS = {"kill": "a kill", "corrupt": "a corruption", "power": "a power cut", "errno": "an I/O error",
                 "term": "a SIGTERM", "diskfull": "a full disk", "net": "a network cut", "node": "a node fault",
                 "stale": "a stale copy", "swap": "a swap of two ranks' files", "payload": "a planted payload",
                 "reorder": "writes reordered before a power cut",
                 "sched": "a Slurm requeue, preemption or node loss", "stop": "a hung process (SIGSTOP)",
                 "restart": "a container restarted in place"}

# A line of output that quotes an exception (``[rank0]: ValueError: ...``); its type (``EOFError`` too).
# Every pattern here runs in time linear in its input: a results file is untrusted.
_EXC = re.compile(r"(?:Error|Exception|Interrupt):")
_EXC_AT = re.compile(r"(?:^|(?<=[\s:\]]))(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|BadZipFile|Warning))"
                     r"(?::\s?(?P<msg>.*))?$")
# Parsers whose message says where in the bytes they gave up: a torn file's varies with where it was cut,
# and which of them fails (JSONDecodeError, or UnicodeDecodeError before it) with which byte broke. One key.
PARSE_ERROR = "parse_error"
DECODE_ERRORS = frozenset({"JSONDecodeError", "UnicodeDecodeError", "UnpicklingError", "EOFError", "BadZipFile",
                           "BadZipfile", "SafetensorError", "DecodeError", "TOMLDecodeError", "TomlDecodeError",
                           "YAMLError", "ScannerError", "ParserError", "ReaderError"})
_POINT_OUT = re.compile(r"/chaos-job-\w+/point-\d+/out(?=/|$)")
_PATH_END = frozenset(" \t\n'\"`<>")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_NUM = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# An exception the verdict line quotes at its end: "...allowed): [rank0]: ValueError: bad".
_EXC_QUOTED = re.compile(r"(?:\[rank\d+\]:\s*)*\b[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b(?::.*)?$")
_RANK_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s*)+")
_TEMPNAME = re.compile(r"tmp[a-z0-9_]{6,}")


def _d(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _l(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _s(x: Any) -> str:
    return x if isinstance(x, str) else ""


def _scrub(text: str) -> str:
    """Paths under a job exploration's scratch root: a point's ``{out}/...`` as that, any other as
    ``<scratch>`` (``/tmp/chaos-job-x1/point-00003/out/a.pt`` -> ``{out}/a.pt``)."""
    out, i = [], 0
    while (j := text.find("/chaos-job-", i)) >= 0:
        start = j
        while start > i and text[start - 1] not in _PATH_END:
            start -= 1
        end = j + 1
        while end < len(text) and text[end] not in _PATH_END:
            end += 1
        m = _POINT_OUT.match(text, j, end)
        out += [text[i:start], "{out}" + text[m.end():end] if m else "<scratch>"]
        i = end
    return "".join(out) + text[i:]


def normalise(text: str) -> str:
    """``text`` with what differs from point to point made equal: a point's ``{out}`` (its scratch
    path), other scratch paths, hex and every number (``N``). For signatures, never for evidence."""
    return _NUM.sub("N", _HEX.sub("HEX", _scrub(text)))


def natural(text: str) -> list[tuple[int, int | str]]:
    """Sort key reading runs of digits as numbers: ``op2`` before ``op10``."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text) if t]


def file_key(path: str) -> str:
    """A file under ``{out}`` as a cause names it: runs of digits (a step, a rank) and random temp
    names become ``*``, so ``checkpoint-4/model.pt`` and ``checkpoint-8/model.pt`` are one file."""
    if path in ("", "."):
        return "{out}"
    return re.sub(r"\d+", "*", _TEMPNAME.sub("tmp*", path))


def exception_line(sc: dict[str, Any]) -> str:
    """The whole line that says why the resume failed: the last exception in the liveness evidence's
    output tail (the line ``chaos.launch.job.cause`` picks, uncut), else what the verdict quoted."""
    live = _d(_d(sc.get("oracles")).get("liveness"))
    tail = _s(_d(live.get("evidence")).get("output_tail"))
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC.search(ln) and "ChildFailedError" not in ln:
            return ln
    m = _EXC_QUOTED.search(_s(live.get("summary"))[-1000:])  # the judge quotes at most 200 characters
    return m.group().strip() if m else ""


def signature(line: str) -> tuple[str, str]:
    """(key, shown) of an exception line: ``shown`` the whole line normalised; ``key``
    :data:`PARSE_ERROR` for a parser's error (:data:`DECODE_ERRORS`), else its type and the message
    up to the first ``": "``."""
    flat = _RANK_PREFIX.sub("", line.strip())
    m = _EXC_AT.search(flat)
    if not m:
        shown = normalise(flat)
        return shown, shown
    etype, msg = m.group("type"), (m.group("msg") or "").strip()
    shown = normalise(f"{etype}: {msg}" if msg else etype)
    if etype.rsplit(".", 1)[-1] in DECODE_ERRORS:
        return PARSE_ERROR, shown
    if not msg:
        return etype, shown
    return f"{etype}: {normalise(msg).split(': ', 1)[0]}", shown


@dataclass
class Point:
    """One failing point as a cause sees it."""

    index: int  # in the document's ``scenarios``
    scenario: dict[str, Any]
    family: str
    landed: str  # where the fault landed, normalised ("kill after open of ckpt.json")
    kind: str
    file: str
    detail: str
    sig_key: str
    sig_shown: str
    line: str  # the whole exception line, as recorded

    @property
    def id(self) -> str:
        return str(self.scenario.get("id") or "?")

    @property
    def replay(self) -> str:
        return _s(self.scenario.get("replay"))

    def summary(self) -> str:
        """The point's verdict line, with the exception line whole where the judge cut it."""
        text = _s(self.scenario.get("summary"))
        if self.line:
            cut = self.line.strip()[:200].strip()
            if cut != self.line and cut in text and self.line not in text:
                text = text.replace(cut, self.line, 1)
        return text


@dataclass
class Cause:
    """Points with one outcome, kind, file, detail and signature: one defect, one fix."""

    outcome: str
    kind: str
    file: str
    detail: str
    sig_key: str
    points: list[Point] = field(default_factory=list)

    @property
    def id(self) -> str:
        """Stable across runs of the same job (no point id or count in it): the JUnit testcase name."""
        return ":".join(x for x in (self.outcome, self.kind, self.detail, self.file, self.sig_key) if x)

    @property
    def count(self) -> int:
        return len(self.points)

    @property
    def title(self) -> str:
        known = KINDS.get(self.kind)
        if known is None:
            family = self.detail or "fault"
            return f"{_OUTCOME_WORDS.get(self.outcome, self.outcome)} after {_FAMILY_WORDS.get(family, family)}"
        return known.title.format(file=self.file or "{out}", detail=self.detail or "entry")

    @property
    def fix(self) -> str | None:
        known = KINDS.get(self.kind)
        return known.fix if known else None

    @property
    def fix_text(self) -> str:
        return self.fix or NO_FIX

    def ids(self) -> list[str]:
        """The point ids, in natural order (``rank0:op2`` before ``rank0:op10``)."""
        return sorted((p.id for p in self.points), key=natural)

    def families(self) -> list[tuple[str, int]]:
        n = Counter(p.family for p in self.points)
        return sorted(n.items(), key=lambda kv: (FAMILY_ORDER.index(kv[0]) if kv[0] in FAMILY_ORDER else 99, kv[0]))

    def families_text(self) -> str:
        return ", ".join(f"{f} {n}" for f, n in self.families())

    def where(self) -> list[tuple[str, int]]:
        """Where the faults landed, most frequent first."""
        return sorted(Counter(p.landed for p in self.points).items(), key=lambda kv: (-kv[1], kv[0]))

    def signatures(self) -> list[tuple[str, int]]:
        """The distinct (normalised) failure lines, most frequent first; none for a lost_work cause."""
        n = Counter(p.sig_shown for p in self.points if p.sig_shown)
        return sorted(n.items(), key=lambda kv: (-kv[1], kv[0]))

    @property
    def representative(self) -> Point:
        """The point that shows the cause best: the most common signature, a plain kill before a
        power cut or a corruption (nothing else to set up when replayed), then document order."""
        common = self.signatures()[0][0] if self.signatures() else ""

        def rank(p: Point) -> tuple[int, int, int]:
            fam = REPRESENTATIVE_ORDER.index(p.family) if p.family in REPRESENTATIVE_ORDER else 99
            return (p.sig_shown != common, fam, p.index)

        return min(self.points, key=rank)

    def headline(self) -> str:
        return f"{self.outcome.upper()}, {self.count} point(s): {self.title}"


def _result_globs(doc: dict[str, Any]) -> list[str]:
    spec = _d(_d(doc.get("job")).get("spec"))
    return [g for g in _l(spec.get("result_files")) if isinstance(g, str)]


class _Files:
    """What the document's own points show about the files under ``{out}``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        opens: dict[str, set[int]] = {}
        self.renamed: set[str] = set()
        self.dirs: set[str] = {".", ""}
        self.weight: Counter[str] = Counter()
        for sc in _l(doc.get("scenarios")):
            params = _fault(sc)[1] if isinstance(sc, dict) else {}
            path, event, nth = _s(params.get("path")), _s(params.get("event")), params.get("nth")
            if not path:
                continue
            self.weight[file_key(path)] += 1
            if event in ("rename", "link"):
                self.renamed.add(path)  # a rename point names its destination
            elif event in ("mkdir", "rmdir"):
                self.dirs.add(path)
            elif event in ("open", "truncate") and isinstance(nth, int):
                opens.setdefault(path, set()).add(nth)
        self.results = _result_globs(doc)
        ordered = sorted(opens)

        def is_dir(p: str) -> bool:  # another opened path lies under it
            k = bisect.bisect_left(ordered, p + "/")
            return k < len(ordered) and ordered[k].startswith(p + "/")

        self.in_place = {p for p, nths in opens.items() if max(nths) > 1 and p not in self.renamed
                         and p not in self.dirs and not is_dir(p)}

    def rank(self, path: str) -> tuple[bool, int]:
        """Sort key of a candidate file: checkpoints (not a --result-file) first, the most saved first."""
        result = any(fnmatch.fnmatch(path, g) for g in self.results)
        return (result, -self.weight[file_key(path)])


def _failing_oracles(sc: dict[str, Any]) -> list[str]:
    return [str(n) for n, o in _d(sc.get("oracles")).items() if _d(o).get("result") == "fail"]


def _power(sc: dict[str, Any], outcome: str, files: _Files, line: str) -> tuple[str, str, str, str] | None:
    """(kind, file, detail, landed) of a power cut, from what it lost; None when it lost nothing."""
    lost = [e for e in _l(_d(sc.get("fault_applied")).get("lost")) if isinstance(e, dict) and _s(e.get("path"))
            and e.get("what") in ("dir_entry", "data")]
    if not lost:
        return None
    paths = list(dict.fromkeys(_s(e.get("path")) for e in lost))
    named = [p for p in paths if p and p in line]  # the file the failing line names explains it
    path = named[0] if named else sorted(paths, key=lambda p: (files.rank(p), paths.index(p)))[0]
    mine = [e for e in lost if e.get("path") == path]
    dirs = [e for e in mine if e.get("what") == "dir_entry"]
    data = [e for e in mine if e.get("what") == "data"]
    # a vanished (or undeleted) file loses work; a file present with lost or torn data fails to load
    entry = (dirs or data)[0] if outcome == "lost_work" else (data or dirs)[0]
    key = file_key(path)
    if entry.get("what") == "dir_entry":
        op = _s(entry.get("op")) or "entry"
        return "dir_not_fsynced", key, op, f"{op} of {key} lost (directory not fsynced)"
    landed = f"unsynced data of {key} {'torn' if entry.get('torn') else 'lost'}"
    if outcome == "silent_divergence":
        return "torn_accepted", key, "", landed
    if outcome == "hard_failure" and path in files.in_place:
        return "in_place", key, "", landed
    return "data_not_fsynced", key, "", landed


# A point id's mode (chaos.model.jobspec.parse_point's grammar) -> the fault record's kind and when,
# for a document whose points carry no fault record.
_MODE_KIND = {"before": "crash", "after": "crash", "torn": "crash", "bitflip": "corrupt", "truncate": "corrupt",
              "zero": "corrupt", "delete": "corrupt", "power": "powerloss", "enospc": "ioerror", "eio": "ioerror",
              "kill": "kill", "term": "term", "net": "netcut", "requeue": "sched", "preempt": "sched", "node": "sched",
              "stale": "stale", "swap": "swap", "payload": "payload", "reorder": "reorder", "stop": "stop",
              "restart": "restart"}


def _from_id(pid: str, anchored: str) -> tuple[str, dict[str, Any]]:
    """(fault kind, params) of a point id and its anchored form (``scenario.point``):
    ``rank0:op10:after@open:ckpt.json:4`` -> (crash, {when: after, event: open, path: ckpt.json, nth: 4})."""
    if pid.startswith("node"):
        return "node_loss", {}
    if pid.startswith("disk:full:"):
        return "diskfull", {}
    parts = pid.split("@", 1)[0].partition("=")[0].split(":")  # (=FILE: the file an at-rest point strikes)
    mode = parts[2] if len(parts) > 2 else ""
    kind = _MODE_KIND.get(mode, "")
    params: dict[str, Any] = {"when": mode} if kind in ("crash", "corrupt", "ioerror", "kill", "term") else {}
    anchor = anchored.partition("@")[2]
    event, _, rest = anchor.partition(":")
    path, _, nth = rest.rpartition(":")
    if event and path and nth.isdigit():
        params.update(event=event, path=path, nth=int(nth))
    return kind, params


def _fault(sc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(kind, params) of a point's fault record (``faults[0]``); without one, what its id and its
    anchored form (``scenario.point``) say."""
    fault = _d((_l(sc.get("faults")) or [None])[0])
    kind, params = _s(fault.get("kind")), _d(fault.get("params"))
    if not kind:
        kind, parsed = _from_id(str(sc.get("id") or ""), _s(_d(sc.get("scenario")).get("point")))
        params = {**parsed, **params}
    return kind, params


def _classify(sc: dict[str, Any], files: _Files, line: str) -> tuple[str, str, str, str, str]:
    """(family, kind, file, detail, landed) of a failing point."""
    outcome = _s(sc.get("outcome"))
    kind_of_fault, params = _fault(sc)
    family = FAMILY.get(kind_of_fault, kind_of_fault or "fault")
    applied = _d(sc.get("fault_applied"))
    fired = _d((_l(sc.get("fired")) or [None])[0])
    path = _s(params.get("path")) or _s(fired.get("rel"))
    event = _s(params.get("event")) or _s(fired.get("op"))
    when = _s(params.get("when"))
    if family == "diskfull":
        first = _d(applied.get("first_enospc"))
        path, event, when = _s(first.get("rel")), _s(first.get("op")), "enospc"
    key = file_key(path) if path else ""

    def unknown(landed: str) -> tuple[str, str, str, str, str]:
        return family, "unknown", key, family, landed

    def torn_file(landed: str) -> tuple[str, str, str, str, str]:
        """A save stopped mid-way and the resume failed: the file it was writing is the defect."""
        if path in files.in_place and event not in ("unlink", "rmdir", "rename"):
            return family, "in_place", key, "", landed
        return family, "incomplete_loaded", key, "", landed

    if family == "power":
        got = _power(sc, outcome, files, line)
        if got is not None:
            kind, file, detail, landed = got
            return family, kind, file, detail, landed
        landed = f"power cut after {event} of {key}" if event else "power cut"
        return torn_file(landed) if outcome == "hard_failure" and path else unknown(landed)
    if family == "corrupt":
        key = file_key(_s(applied.get("file")) or path)
        landed = f"{when or 'corruption'} of {key}" + (" at rest" if "at_step" in applied or "checkpoint_step" in applied
                                                      or params.get("at_step") is not None else "")
        kind = {"hard_failure": "corrupt_fatal", "silent_divergence": "no_checksum",
                "lost_work": "no_fallback"}.get(outcome)
        return (family, kind, key, "", landed) if kind else unknown(landed)
    if family in ("stale", "swap", "payload", "reorder"):
        key = file_key(_s(applied.get("file")) or path)
        landed = {"stale": "stale copy of", "swap": "swap of", "payload": "payload in",
                  "reorder": "writes reordered in"}[family] + f" {key}" + (
            " at rest" if params.get("at_step") is not None else "")
        if family == "payload" and outcome == "code_execution":
            return family, "unpickles_checkpoint", key, "", landed
        if family == "reorder" and outcome in ("lost_work", "hard_failure"):
            return family, "data_not_fsynced", key, "", landed  # a power cut's loss: the fix is the fsync
        kind = {"hard_failure": "corrupt_fatal", "lost_work": "no_fallback",
                "silent_divergence": {"stale": "stale_accepted", "swap": "swap_accepted",
                                      "reorder": "reorder_accepted"}.get(family)}.get(outcome)
        return (family, kind, key, "", landed) if kind else unknown(landed)
    if family in ("errno", "diskfull"):
        code = when.upper() if when in ("enospc", "eio") else {"fsyncfail": "EIO of an fsync", "slowio": "delay"}.get(
            when, when or "errno")
        landed = (f"full disk at {event} of {key}" if family == "diskfull" else f"{code} at {event} of {key}") \
            if event else f"{code}"
        if outcome == "hard_failure" and path:
            return torn_file(landed)
        if outcome in ("lost_work", "silent_divergence"):
            return family, "errno_swallowed", key, code, landed
        return unknown(landed)
    if family == "stop" and event and event != "step":  # a process hung right after a file event of a save
        landed = f"hang after {event} of {key}"
        if outcome in ("hard_failure", "silent_divergence") and path:
            return family, "commit_past_hung_rank", key, "", landed
        return unknown(landed)
    if family == "sched" and event:  # Slurm struck right after a file event: the middle of a save
        landed = f"Slurm {when or 'requeue'} after {event} of {key}"
        if outcome == "hard_failure":
            return torn_file(landed)
    elif family == "kill" and event and event not in ("step", "phase"):  # a kill at a file event
        word = {"before": "kill before", "after": "kill after", "torn": "torn", "crash": "kill before",
                "shortwrite": "torn"}.get(when, f"kill ({when})")
        landed = f"{word} {event} of {key}"
        if outcome == "hard_failure":
            return torn_file(landed)
    elif kind_of_fault == "crash":  # at a file event the document does not name
        landed = {"before": "kill before a file event", "after": "kill after a file event",
                  "torn": "torn write"}.get(when, "kill at a file event")
    elif family == "kill" and params.get("phase"):  # at a phase the checkpointer announced (chaos.phases)
        landed = f"kill at the {_s(params.get('phase'))} phase of a save"
    else:
        landed = {"kill": "kill between saves", "term": "SIGTERM", "stop": "hang between saves",
                  "restart": "container restart between saves",
                  "sched": f"Slurm {when or 'requeue'} between saves"}.get(family, f"{family} fault")
    if family == "term" and outcome == "hard_failure" and "preemption_exit" in _failing_oracles(sc):
        return family, "term_exit0", "", "", landed
    if family in ("kill", "term", "sched", "restart"):
        if outcome == "lost_work":
            return family, "ignores_newest", "", "", landed
        if outcome == "silent_divergence":
            return family, "state_missing", "", "", landed
    return family, "unknown", "", family, landed


def _second_lost(sc: dict[str, Any]) -> str:
    """The first file a second fault's power cut lost (``lost`` of its record), or ""."""
    evidence = _d(_d(_d(sc.get("oracles")).get("liveness")).get("evidence"))
    lost = _l(_d(evidence.get("second_fault")).get("lost"))
    first = _d(lost[0]) if lost else {}
    return _s(first.get("path") or first.get("file") or first.get("name"))


def _point(index: int, sc: dict[str, Any], files: _Files) -> Point:
    outcome = _s(sc.get("outcome"))
    line = exception_line(sc) if outcome == "hard_failure" else ""
    family, kind, file, detail, landed = _classify(sc, files, line)
    again = [_d(f) for f in _l(sc.get("faults"))[1:] if _d(f).get("attempt")]
    power_again = bool(again) and again[0].get("kind") == "powerloss"
    if again:  # struck again inside its resume: a kill, or a power cut the harness made
        landed += f"; then {'a power cut' if power_again else 'a kill'} inside its restart"
        if power_again and outcome in ("lost_work", "hard_failure"):
            # the restart got past the first fault (it reached the cut's event), the next one failed:
            # the cut took what the recovery had not made durable
            lost = _second_lost(sc)
            kind, file, detail = "recovery_not_durable", lost or "a checkpoint", ""
        elif outcome == "lost_work" and kind in ("ignores_newest", "unknown"):  # the first crash alone lost nothing
            kind, file, detail = "recovery_unsafe", "", ""
    if outcome == "hard_failure":
        if line:
            sig_key, sig_shown = signature(line)
        else:  # no exception: how the resume ended ("timed out", "exited 0 mid-run" for a SIGTERM)
            failing = _failing_oracles(sc)
            oracle = "liveness" if "liveness" in failing else (failing[0] if failing else "")
            head = normalise(_s(_d(_d(sc.get("oracles")).get(oracle)).get("summary")).split(": ", 1)[0])
            sig_key = sig_shown = head
    elif outcome == "silent_divergence":
        sig_key = sig_shown = ", ".join(o for o in _failing_oracles(sc) if o != "durability")
    else:
        sig_key = sig_shown = ""
    return Point(index, sc, family, printable(landed), kind, file, detail, sig_key, sig_shown, line)


def _order(c: Cause) -> tuple[int, int, str]:
    return (OUTCOME_ORDER.index(c.outcome) if c.outcome in OUTCOME_ORDER else len(OUTCOME_ORDER), -c.count, c.id)


def group(doc: dict[str, Any]) -> list[Cause]:
    """The causes of a job document's failing points (verdict ``fail``), worst outcome first, then
    the most points. Empty for any other document (a built-in run, a certification)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("job"), dict):
        return []
    files = _Files(doc)
    causes: dict[tuple[str, ...], Cause] = {}
    for i, sc in enumerate(_l(doc.get("scenarios"))):
        if not isinstance(sc, dict) or sc.get("verdict") != "fail":
            continue
        p = _point(i, sc, files)
        outcome = _s(sc.get("outcome")) or "fail"
        k = (outcome, p.kind, p.file, p.detail, p.sig_key)
        causes.setdefault(k, Cause(outcome, p.kind, p.file, p.detail, p.sig_key)).points.append(p)
    return sorted(causes.values(), key=_order)


def detail_lines(c: Cause) -> list[str]:
    """What a cause's report says beyond its headline, one line each, whole (plain text: each
    renderer escapes it): the fix, the families, where the faults landed, how the resume failed,
    the representative's verdict line and replay command."""
    rep = c.representative
    lines = [f"fix: {c.fix_text}", f"covers: {c.families_text()}",
             "at: " + "; ".join(f"{w} ({n})" if n > 1 else w for w, n in c.where())]
    if c.signatures() and c.outcome == "hard_failure":
        lines.append("fails with: " + "; ".join(f"{s} ({n})" for s, n in c.signatures()))
    elif c.sig_key:
        lines.append(f"failing: {c.sig_key}")
    lines.append(f"representative: {rep.id} ({rep.landed}): {' '.join(rep.summary().split())}")
    if rep.replay:
        lines.append(f"replay: {rep.replay}")
    return lines


def cause_case(c: Cause) -> Case:
    """A cause as one test case: CI dashboards count causes, not points. ``name`` is the cause's
    stable id, the message its headline and fix, the text its details and every point id;
    ``properties`` the kind, the count, and each point id with its replay command."""
    rep = c.representative
    props = [("chaos.cause.kind", c.kind), ("chaos.cause.points", str(c.count))]
    props += [(p.id, p.replay) for p in sorted(c.points, key=lambda p: natural(p.id))]
    seconds = sum(float(s) for p in c.points if isinstance(s := p.scenario.get("seconds"), int | float)
                  and not isinstance(s, bool))
    return Case(classname=dotted_classname(str(rep.scenario.get("checkpointer") or "job")), name=c.id,
                outcome="fail", label=c.outcome, message=f"{c.headline()}: {c.fix_text}",
                failure_type=c.outcome, details=[*detail_lines(c), "points: " + ", ".join(c.ids())],
                replay=rep.replay or None, seconds=max(0.0, seconds), properties=props)


def grouped_cases(doc: dict[str, Any]) -> list[Case]:
    """The test cases of a results document with a job's failing points grouped: one case per cause,
    then every other point (pass, skipped, error) as ``reports.cases.cases`` makes it. Any other
    document: ``reports.cases.cases``. ConfigError if ``doc`` is no results document.

    Passing points stay one case each: a pass is that point's own record (its time, its history in
    CI), and the failures count stays the number of defects to fix."""
    check_document(doc)
    causes = group(doc)
    if not causes:
        return point_cases(doc)
    grouped = {p.index for c in causes for p in c.points}
    return [cause_case(c) for c in causes] + [scenario_case(sc) for i, sc in enumerate(doc["scenarios"])
                                              if isinstance(sc, dict) and i not in grouped]


def tally(causes: list[Cause]) -> str:
    """``70 failing point(s), 5 cause(s)``."""
    return f"{sum(c.count for c in causes)} failing point(s), {len(causes)} cause(s)"


def abbreviated(ids: list[str], shown: int = POINTS_SHOWN) -> str:
    """``a, b, c and 27 more``: a cause's points in one line."""
    head = ", ".join(ids[:shown])
    return head + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def console_lines(doc: dict[str, Any], shown: int = POINTS_SHOWN) -> list[str]:
    """The end of a job run on the console: one block per cause (headline; fix; families and where
    the faults landed; the failure signatures; one representative with its verdict line and replay
    command; the point ids, abbreviated). Plain text, control characters escaped, never cut."""
    causes = group(doc)
    if not causes:
        return []
    lines = [f"{tally(causes)}:"]
    for c in causes:
        rep = c.representative
        lines.append(printable(c.headline()))
        lines.append(f"  fix: {printable(c.fix_text)}")
        where = "; ".join(f"{w} ({n})" if n > 1 else w for w, n in c.where()[:4])
        more = len(c.where()) - 4
        lines.append(f"  covers: {printable(c.families_text())}")
        lines.append(f"  at: {where}" + (f"; {more} more" if more > 0 else ""))
        sigs = c.signatures()
        if sigs and c.outcome == "hard_failure":
            shown_sigs = "; ".join(f"{printable(s)} ({n})" for s, n in sigs[:3])
            lines.append(f"  fails with: {shown_sigs}" + (f"; {len(sigs) - 3} more" if len(sigs) > 3 else ""))
        lines.append(f"  e.g. {printable(rep.id)} ({rep.landed}): {printable(' '.join(rep.summary().split()))}")
        if rep.replay:
            lines.append(f"    replay: {printable(rep.replay)}")
        lines.append(f"  points: {printable(abbreviated(c.ids(), shown))}")
    return lines


__all__ = ["Cause", "KINDS", "Kind", "NO_FIX", "PARSE_ERROR", "Point", "abbreviated", "cause_case", "console_lines",
           "detail_lines", "exception_line", "file_key", "group", "grouped_cases", "natural", "normalise", "signature",
           "tally"]
