"""The storage findings table: what ``chaos certify`` and ``chaos savers`` measured on real mounts.

``chaos findings REPORT.json...`` (``chaos.cli.commands.findings``) hands the documents
whose ``kind`` is ``certification`` (``chaos certify --json``) or ``block-crash-savers``
(``chaos savers --json``) to this module; job results go to
:mod:`chaos.cli.findings`. :func:`render` writes the Markdown of
``docs/storage-findings.md``:

1. one row per certified mount: what it is (from the ``mount`` the report read out of
   ``/proc/self/mountinfo``: fs type, the mount options that change what a crash keeps,
   the FUSE program), the date, the verdict, what failed or was not tested, and what a
   user should do (:data:`ADVICE`, keyed by property: the only words not from a run);
2. the property-by-mount matrix (pass / FAIL / n/a);
3. the evidence of every failing property and every untested campaign scenario, as the
   report said it;
4. the unsafe and safe savers under block-level power loss: states checked, distinct, and
   in how many distinct states the renamed file was lost or torn.

Every document is hostile input: :func:`read_document` validates what it uses with a
JSON Schema (``jsonschema``) and a violation is one ``ConfigError`` naming the file and
the field. Standard library and jsonschema only: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.errors import ConfigError
from reports.summary import cell

CERTIFICATION = "certification"
SAVERS = "block-crash-savers"
KINDS = (CERTIFICATION, SAVERS)
SUMMARY_LIMIT = 400  # characters of a property's summary in the evidence list
ERRORED = "the check itself failed: "  # how certify's battery says a property could not run (battery._guard)

# What a user should do when a property fails: the table's one human column.
ADVICE = {
    "client_crash": "Do not save through this mount: stage on local disk and upload with an object-store commit "
                    "protocol (the reference checkpointer's s3:// backend writes the manifest last, conditionally)",
    "durable_medium": "Staging only: save here for speed, then copy each step to durable storage with its own "
                      "commit protocol before counting it as saved",
    "read_after_write": "A fresh reader does not see what was just written: resume only after the mount settles, "
                        "or save through the object store's own API instead",
    "commit_atomicity": "A crash mid-save can leave a step that is listed but does not load: use a commit "
                        "protocol that does not rely on this mount's rename",
    "partial_invisible": "Half-written steps are visible to readers: never resume from this mount without "
                         "verifying every shard",
    "concurrent_writers": "Two writers can both believe they committed: give each job its own directory",
    "dropped_connection": "A dropped connection can be acknowledged as a save: add retries with verification",
    "full_disk": "A full disk can be acknowledged as a save: watch free space and verify after saving",
    "orphan_cleanup": "Aborted saves leave data behind: sweep temporary entries on restart",
    "checksums_round_trip": "Stored bytes come back changed: verify checksums on every load",
    "block_power_loss": "A power cut can lose or tear a committed step: mount with data=ordered (ext4) or use a "
                        "checkpointer that fsyncs the file and the directory around the rename",
}
ERRORED_ADVICE = ("Where a check could not even run, the mount answered with an error where data was expected "
                  "(see the evidence): do not save through it")
CAMPAIGN_ADVICE = "The reference checkpointer's faulted save failed here: replay the scenario (its command is below)"
NOT_TESTED_ADVICE = "Run certify again: a scenario whose fault did nothing tested nothing"
CERTIFIED_ADVICE = "Save here directly: every property held and every campaign scenario passed"
# Mount options that change what a crash keeps (the rest, rw, relatime, uid=..., are omitted from the label).
BEHAVIOUR_OPTIONS = ("data=", "noauto_da_alloc", "auto_da_alloc", "nobarrier", "barrier", "commit=", "sync",
                     "dirsync", "flushoncommit", "wsync", "journal_async_commit", "nodatacow", "nodatasum")
DEFAULT_OPTIONS = {"ext4": "data=ordered"}  # what the kernel does not list in mountinfo

_STR = {"type": "string"}
_STRN = {"type": ["string", "null"]}
_PROPERTY = {"type": "object", "required": ["name", "status", "summary"],
             "properties": {"name": _STR, "status": {"enum": ["pass", "fail", "n/a"]}, "summary": _STR}}
_SCENARIO = {"type": "object", "required": ["name", "verdict"],
             "properties": {"name": _STR, "verdict": _STR, "error": _STRN, "replay": _STRN}}
_MOUNT = {"type": ["object", "null"], "required": ["mount_point", "fstype", "source", "options"],
          "properties": {"mount_point": _STR, "fstype": _STR, "source": _STR, "client": _STRN,
                         "options": {"type": "array", "items": _STR}}}
CERT_SCHEMA = {
    "type": "object",
    "required": ["kind", "backend", "verdict", "failing", "properties", "campaign"],
    "properties": {
        "kind": {"const": CERTIFICATION}, "backend": _STR, "date": _STR, "mount": _MOUNT,
        "verdict": {"enum": ["CERTIFIED", "NOT CERTIFIED", "NOT TESTED"]}, "partial": _STRN,
        "failing": {"type": "array", "items": _STR}, "not_tested": {"type": "array", "items": _STR},
        "properties": {"type": "array", "items": _PROPERTY}, "campaign": {"type": "array", "items": _SCENARIO},
        "setup": _STR, "suite_test": _STR,
    },
}
_COUNT = {"type": "integer", "minimum": 0}
SAVERS_SCHEMA = {
    "type": "object",
    "required": ["kind", "date", "rows"],
    "properties": {
        "kind": {"const": SAVERS}, "date": _STR, "seed": {"type": "integer"},
        "host": {"type": "object", "properties": {"kernel": _STR}},
        "rows": {"type": "array", "items": {
            "type": "object", "required": ["fs", "options", "saver", "states", "distinct", "lost", "torn", "ok"],
            "properties": {"fs": _STR, "options": _STR, "saver": _STR, "states": _COUNT, "distinct": _COUNT,
                           "lost": _COUNT, "torn": _COUNT, "ok": _COUNT}}},
    },
}


@dataclass(frozen=True)
class MountRun:
    """One ``chaos certify`` report, as the table shows it."""

    source: str  # the file it came from
    label: str
    date: str
    verdict: str
    partial: str | None
    failing: tuple[str, ...]
    not_tested: tuple[str, ...]
    statuses: tuple[tuple[str, str], ...]  # (property, pass | fail | n/a), in the report's order
    evidence: tuple[tuple[str, str], ...]  # (what, what the report said) for each failure and untested scenario
    setup: str
    suite_test: str


@dataclass(frozen=True)
class SaverRun:
    """One ``chaos savers`` document."""

    source: str
    date: str
    kernel: str
    rows: tuple[dict[str, Any], ...]


def is_storage(doc: Any) -> bool:
    """Whether a parsed JSON document is one this module renders (else it is a job's results)."""
    return isinstance(doc, dict) and doc.get("kind") in KINDS


def read_document(doc: Any, source: str) -> MountRun | SaverRun:
    """The run a certification or savers document describes; ConfigError naming ``source`` otherwise."""
    import jsonschema

    kind = doc.get("kind") if isinstance(doc, dict) else None
    schema = CERT_SCHEMA if kind == CERTIFICATION else SAVERS_SCHEMA if kind == SAVERS else None
    if schema is None:
        raise ConfigError(f"{source}: not a storage document (its 'kind' is {kind!r}, expected one of "
                          f"{', '.join(KINDS)})")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if error is not None:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ConfigError(f"{source} is not a valid {kind} document: {where}: {error.message[:200]}")
    if kind == SAVERS:
        return SaverRun(source, doc["date"], (doc.get("host") or {}).get("kernel", "?"),
                        tuple(dict(r) for r in doc["rows"]))
    return _mount_run(doc, source)


def _mount_run(doc: dict[str, Any], source: str) -> MountRun:
    props = doc["properties"]
    evidence = [(p["name"], p["summary"]) for p in props if p["status"] == "fail"]
    throughput = doc.get("throughput")
    if isinstance(throughput, dict) and isinstance(throughput.get("error"), str):
        evidence.append(("throughput", throughput["error"]))
    for s in doc["campaign"]:
        if s["verdict"] != "pass":
            said = s.get("error") or s["verdict"]
            evidence.append((f"campaign: {s['name']}", said + (f" (replay: {s['replay']})" if s.get("replay") else "")))
    where = (doc["mount"] or {}).get("mount_point")
    if where and where != "/":  # the run's own temp path says nothing to a reader of the table
        evidence = [(what, said.replace(where, "MOUNT")) for what, said in evidence]
    return MountRun(source, label(doc["mount"], doc["backend"]), doc.get("date", "undated"), doc["verdict"],
                    doc.get("partial"), tuple(doc["failing"]), tuple(doc.get("not_tested") or ()),
                    tuple((p["name"], p["status"]) for p in props), tuple(evidence),
                    doc.get("setup", ""), doc.get("suite_test", ""))


def label(mount: dict[str, Any] | None, backend: str) -> str:
    """What a mount is, in a few words: ``ext4 (data=writeback)``, ``fuse.s3fs (s3fs)``; the backend URL otherwise."""
    if mount is None:
        return backend
    fstype = mount["fstype"]
    kept = [o for o in mount["options"] if o.startswith(BEHAVIOUR_OPTIONS)]
    if fstype in DEFAULT_OPTIONS and not any(o.startswith(DEFAULT_OPTIONS[fstype].split("=")[0] + "=") for o in kept):
        kept.insert(0, f"{DEFAULT_OPTIONS[fstype]}, the default")
    what = ", ".join(x for x in (mount.get("client") or "", *kept) if x)
    return f"{fstype} ({what})" if what else fstype


def advice(run: MountRun) -> str:
    """What a user should do with this mount, from what failed (ADVICE) or was not tested."""
    if run.verdict == "CERTIFIED":
        return CERTIFIED_ADVICE
    errored = {what for what, text in run.evidence if text.startswith(ERRORED)}
    said = [ADVICE.get(name, f"{name} failed: see its evidence") for name in run.failing
            if not name.startswith("campaign: ") and name not in ("cleanup", "throughput") and name not in errored]
    if errored:
        said.append(ERRORED_ADVICE)
    if any(name.startswith("campaign: ") for name in run.failing):
        said.append(CAMPAIGN_ADVICE)
    if "throughput" in run.failing:
        said.append("A verified load right after a save failed: see the throughput evidence")
    if "cleanup" in run.failing:
        said.append("Certify could not remove what it wrote: check the mount's delete permissions")
    if run.not_tested:
        said.append(NOT_TESTED_ADVICE)
    if run.partial:
        said.append("A partial run: certify again without --only, --quick or --no-campaign")
    return "; ".join(dict.fromkeys(said)) or "See the evidence"


def render(runs: list[MountRun | SaverRun]) -> str:
    """The Markdown of the storage findings (the four parts of the module docstring)."""
    mounts = [r for r in runs if isinstance(r, MountRun)]
    savers = [r for r in runs if isinstance(r, SaverRun)]
    out: list[str] = []
    if mounts:
        out += ["## Verdicts", "", "| Mount | Date | Verdict | Failing | Not tested | What to do |",
                "|---|---|---|---|---|---|"]
        for r in mounts:
            out.append(f"| {cell(r.label)} | {r.date} | **{r.verdict}** | {cell(', '.join(r.failing) or '-', None)} | "
                       f"{cell('; '.join(r.not_tested) or '-', None)} | {cell(advice(r), None)} |")
        out += ["", "## Property by mount", ""] + _matrix(mounts) + ["", "## Evidence", ""]
        for r in mounts:
            out.append(f"### {r.label}")
            out.append("")
            if r.setup:
                out.append(f"Mounted as: {r.setup}.")
            if r.suite_test:
                out.append(f"Pinned by `{r.suite_test}`" + (" (a strict xfail: the refusal is checked to be this "
                                                            "one before it counts)." if r.verdict == "NOT CERTIFIED"
                                                            else "."))
            if r.setup or r.suite_test:
                out.append("")
            out += [f"- **{cell(what, None)}**: {cell(said, SUMMARY_LIMIT)}" for what, said in r.evidence] or [
                "Nothing failed."]
            out += ["", f"<sub>from {r.source}</sub>", ""]
    if savers:
        out += ["## An unsafe and a safe save under block-level power loss", "",
                "Each distinct crash state of a save that replaces `ckpt.bin` is *lost* (the file missing, or old after "
                "the save returned), *torn* (zeros, short, a mixture) or *ok*. The unsafe saver renames a temp file "
                "over it without any fsync; the safe one fsyncs the file, renames, fsyncs the directory.", "",
                "| File system | Mount options | Saver | States checked | Distinct | Lost | Torn | OK | Date |",
                "|---|---|---|---|---|---|---|---|---|"]
        for s in savers:
            for row in s.rows:
                out.append(f"| {cell(row['fs'])} | {cell(row['options'])} | {cell(row['saver'])} | {row['states']} | "
                           f"{row['distinct']} | {row['lost']} | {row['torn']} | {row['ok']} | {s.date} |")
        out += [""] + [f"<sub>from {s.source} (kernel {s.kernel})</sub>" for s in savers] + [""]
    return "\n".join(out).rstrip() + "\n"


def _matrix(mounts: list[MountRun]) -> list[str]:
    names: list[str] = []
    for r in mounts:
        names += [n for n, _ in r.statuses if n not in names]
    shown = {"pass": "pass", "fail": "**FAIL**", "n/a": "n/a"}
    statuses = [dict(r.statuses) for r in mounts]
    rows = ["| Property | " + " | ".join(cell(r.label) for r in mounts) + " |",
            "|---|" + "---|" * len(mounts)]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(shown[s[n]] if n in s else "-" for s in statuses) + " |")
    return rows

