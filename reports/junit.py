"""JUnit XML of a results document: ``--junit FILE`` of ``chaos run``, job mode and ``chaos certify``.

One writer for all three documents (see :mod:`reports.cases`): a ``<testcase>`` per
scenario, job point or certification property (``classname`` the checkpointer, ``job``
or the backend; ``name`` the scenario id), with

* ``<failure message="the failing oracles' summaries" type="oracle or outcome">`` whose
  text is the evidence lines and the ``replay:`` command,
* ``<error>`` for a harness error, ``<skipped message="why">`` for a fault that never
  fired or a property that does not apply,

and suite-level counts and times, in the shape the common JUnit schema (Jenkins'
``junit-10.xsd``, which GitHub, GitLab and Jenkins readers accept) describes:
``<testsuites>`` > ``<testsuite>`` > ``<properties>``, ``<testcase>``…, ``<system-out>``.

A job run's failing points are grouped by cause (``reports.causes``): one ``<testcase>``
per cause (``name`` its stable id, such as ``hard_failure:in_place:ckpt.json:parse_error``;
the failure message its headline and fix), whose own ``<properties>`` (first, as pytest
writes them) name the cause's kind and size and every point id with its replay command;
so a CI dashboard counts defects, not the dozens of points one defect fails. Passing,
skipped and erroring points stay a testcase each.

Written with the standard library's ElementTree; characters XML 1.0 cannot carry (a
rank's stray control bytes) are written as ``\\uXXXX`` text rather than making the file
unreadable. ``chaos.cli.main._run``, ``chaos.cli.job._run`` and ``chaos.cli.commands.certify``
call :func:`write_junit` after the results JSON is on disk.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from reports.cases import Case, counts, describe
from reports.causes import group, grouped_cases, tally
from reports.jsonfile import atomic_file

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: Any) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text))


def _secs(value: float) -> str:
    return f"{max(0.0, value):.3f}"


def _testcase(parent: ET.Element, case: Case) -> None:
    tc = ET.SubElement(parent, "testcase", classname=_x(case.classname), name=_x(case.name), time=_secs(case.seconds))
    if case.properties:
        props = ET.SubElement(tc, "properties")
        for key, value in case.properties:
            ET.SubElement(props, "property", name=_x(key), value=_x(value))
    if case.outcome == "pass":
        return
    tag = {"fail": "failure", "error": "error", "skipped": "skipped"}[case.outcome]
    child = ET.SubElement(tc, tag, message=_x(case.message))
    if case.failure_type and tag != "skipped":
        child.set("type", _x(case.failure_type))
    if case.details and tag != "skipped":
        child.text = _x("\n".join(case.details))


def junit_tree(doc: dict[str, Any]) -> ET.ElementTree:
    """The JUnit XML of ``doc`` (ConfigError if it is not a results document)."""
    rows = grouped_cases(doc)
    info = describe(doc)
    causes = group(doc)
    if causes:
        info.notes.append(f"grouped by cause: {tally(causes)} (one testcase per cause; its properties list the points)")
    n = counts(rows)
    seconds = info.seconds if info.seconds is not None else sum(c.seconds for c in rows)
    totals = {"tests": str(len(rows)), "failures": str(n["fail"]), "errors": str(n["error"]),
              "skipped": str(n["skipped"]), "time": _secs(seconds)}
    root = ET.Element("testsuites", name="chaos", **totals)
    suite = ET.SubElement(root, "testsuite", name=_x(info.title), **totals,
                          timestamp=_dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S"), hostname=_x(socket.gethostname()))
    if info.properties:
        props = ET.SubElement(suite, "properties")
        for key, value in info.properties.items():
            ET.SubElement(props, "property", name=_x(key), value=_x(value))
    for case in rows:
        _testcase(suite, case)
    if info.notes:
        ET.SubElement(suite, "system-out").text = _x("\n".join(info.notes))
    ET.indent(root, space=" ")
    return ET.ElementTree(root)


def write_junit(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` as JUnit XML to ``path`` atomically (a reader never sees half a file)."""
    target = Path(path)
    tree = junit_tree(doc)
    with atomic_file(target, "wb") as f:  # its mode as the umask says, not mkstemp's 0600
        tree.write(f, encoding="utf-8", xml_declaration=True)
    return target
