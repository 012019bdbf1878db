"""A Markdown summary of a results document, appended to a file: ``--summary FILE``.

Made for CI step summaries (GitHub's ``$GITHUB_STEP_SUMMARY``: every step appends
Markdown to one file and the run page shows it), so :func:`append_summary` only ever
appends and never truncates what earlier steps wrote. The text is a heading with the
counts, the coverage of a job or campaign (or certified / not for ``chaos certify``), a
table of every failing, erroring and skipped case (id, outcome, summary, the replay
command in backticks), and the passing cases folded into a ``<details>`` block. Cells
are escaped for GitHub-flavoured tables: ``|`` as ``\\|``, newlines folded, HTML
special characters as entities outside code spans.

A job run's failing points are grouped by cause (``reports.causes``): a "Failures by
cause" table (cause, outcome, points, families, fix), then one folded block per cause
with where the faults landed, how the resume failed, a representative point with its
whole verdict line and replay command, and every point id; the per-point table then
lists only the skipped and erroring points.

Called by ``chaos.cli.main._run``, ``chaos.cli.job._run`` and ``chaos.cli.commands.certify``
after the results JSON is on disk.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from reports.cases import Case, cases, counts, describe, one_line, printable
from reports.causes import Cause, group, tally

SUMMARY_LIMIT = 300  # characters of an oracle summary in a cell (the JSON keeps all of it)
PASSING_ROWS = 200  # rows of the folded table of passing cases
CAUSE_POINTS = 100  # point ids listed in a cause's block (the JUnit properties and the JSON keep all)


def cell(text: Any, limit: int | None = SUMMARY_LIMIT) -> str:
    """Plain text for one table cell: one line, ``|`` escaped, HTML special characters as entities."""
    flat = one_line(text, limit)
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    flat = flat.replace("\\", "\\\\")
    return re.sub(r"([|`*_\[\]~])", r"\\\1", flat)


def code(text: Any) -> str:
    """A code span for one table cell: fenced with more backticks than the text holds, ``|`` escaped."""
    flat = one_line(text)
    if not flat:
        return ""
    longest = max((len(m) for m in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or longest else ""
    # GFM splits table rows on unescaped pipes before it parses code spans, so \| is needed (and shown as |).
    return f"{fence}{pad}{flat.replace('|', chr(92) + '|')}{pad}{fence}"


LABEL = {"fail": "❌ fail", "error": "⚠️ error", "skipped": "⏭️ skipped", "pass": "✅ pass"}


def _row(c: Case, passing: bool = False) -> str:
    outcome = LABEL.get(c.outcome, c.outcome) + (f" ({cell(c.label)})" if c.label not in (c.outcome, "") else "")
    cols = [code(c.name), cell(c.classname, 80), outcome]
    if passing:
        cols.append(f"{c.seconds:.1f} s")
    else:
        cols += [cell(c.message) or "-", code(c.replay) if c.replay and c.outcome in ("fail", "error") else "-"]
    return "| " + " | ".join(cols) + " |"


def _cause_lines(causes: list[Cause]) -> list[str]:
    """The "Failures by cause" section: a table, then a folded block of details per cause."""
    lines = ["### Failures by cause", "", f"{tally(causes)}", "",
             "| cause | outcome | points | families | fix |", "|---|---|---:|---|---|"]
    for c in causes:
        lines.append(f"| {cell(c.title, None)} | {cell(c.outcome)} | {c.count} | {cell(c.families_text(), None)} "
                     f"| {cell(c.fix_text, None)} |")
    lines.append("")
    for c in causes:
        rep = c.representative
        head = html.escape(printable(f"{c.outcome}: {c.title} ({c.count} point(s))"))
        where = "; ".join(f"{w} ({n})" if n > 1 else w for w, n in c.where())
        lines += [f"<details><summary>❌ {head}</summary>", "",
                  f"- **fix:** {cell(c.fix_text, None)}", f"- **covers:** {cell(c.families_text(), None)}",
                  f"- **at:** {cell(where, None)}"]
        if c.outcome == "hard_failure" and c.signatures():
            lines.append("- **fails with:** " + "; ".join(f"{code(s)} ({n})" for s, n in c.signatures()))
        lines.append(f"- **representative:** {code(rep.id)} ({cell(rep.landed, None)}): {cell(rep.summary(), None)}")
        if rep.replay:
            lines.append(f"- **replay:** {code(rep.replay)}")
        ids = c.ids()
        shown = ", ".join(code(i) for i in ids[:CAUSE_POINTS])
        more = f" and {len(ids) - CAUSE_POINTS} more (see the results JSON)" if len(ids) > CAUSE_POINTS else ""
        lines += [f"- **points ({len(ids)}):** {shown}{more}", "", "</details>", ""]
    return lines


def markdown_summary(doc: dict[str, Any]) -> str:
    """The Markdown text (ConfigError if ``doc`` is not a results document)."""
    rows = cases(doc)
    info = describe(doc)
    n = counts(rows)
    icon = "❌" if n["fail"] or n["error"] else "✅"
    if info.kind == "certification":
        icon = "✅" if doc.get("certified") else "❌"
    tally = ", ".join(f"{k} {v}" for k, v in n.items() if v) or "nothing ran"
    seconds = info.seconds if info.seconds is not None else sum(c.seconds for c in rows)
    what = "check(s)" if info.kind == "certification" else (
        "point(s)" if info.kind == "job" else "scenario(s)")
    lines = [f"## {icon} {cell(info.title, 160)}", "",
             f"**{len(rows)} {what}: {tally}** in {seconds:.1f} s", ""]
    for note in info.notes:
        lines.append(f"- {cell(note, None)}")
    if info.notes:
        lines.append("")
    causes = group(doc)
    if causes:
        lines += _cause_lines(causes)
        grouped = {str(p.scenario.get("id")) for c in causes for p in c.points}
        rows = [c for c in rows if not (c.outcome == "fail" and c.name in grouped)]
    bad = [c for c in rows if c.outcome != "pass"]
    if bad:
        lines += ["| id | target | outcome | summary | replay |", "|---|---|---|---|---|"]
        lines += [_row(c) for c in bad]
        lines.append("")
    good = [c for c in rows if c.outcome == "pass"]
    if good:
        lines += [f"<details><summary>{len(good)} passed</summary>", "",
                  "| id | target | outcome | time |", "|---|---|---|---:|"]
        lines += [_row(c, passing=True) for c in good[:PASSING_ROWS]]
        if len(good) > PASSING_ROWS:
            lines.append(f"| … | | | {len(good) - PASSING_ROWS} more passed (see the results JSON) |")
        lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"


def append_summary(doc: dict[str, Any], path: str | Path) -> Path:
    """Append the summary of ``doc`` to ``path`` (created if absent; what is there is kept)."""
    target = Path(path)
    text = markdown_summary(doc)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as f:
        if f.tell() > 0:
            f.write("\n")  # a blank line, so this heading never glues onto the last step's text
        f.write(text)
    return target
