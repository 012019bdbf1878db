"""Property: whatever a results file holds, every reader of it ends with a result or one clear error line.

Hypothesis builds hostile inputs from a real built-in results document and a job's: up to
three of its values removed, replaced by a hostile value of the same JSON type (text with
terminal controls, markup or a lone surrogate, a huge or non-finite number, an emptied or
repeated list) that the schema lets through, or by something of another type (a list or
object, nesting 60 to 300 levels deep), or the file replaced by junk bytes, a deep bracket run, a number
of 5,000 digits, a FIFO, a socket, a directory, a device or a symlink to one, a dangling or
looping symlink. Each of ``chaos report``, ``chaos replay --dry-run``, ``chaos findings``,
``chaos repro`` and the CI writers (JUnit XML, the Markdown summary) then

* exits 0, or 2 with exactly one ``chaos: error:`` line naming the file (never a
  traceback, never "harness error");
* prints no control character a terminal would act on;
* finishes within ``SECONDS`` and ``PEAK_MIB`` of Python memory;
* and where it wrote something: an HTML page with no markup from the data, a repro script
  whose code has the same shape as for an untouched document (only its literals differ),
  well-formed JUnit XML and control-free Markdown.

150 examples by default (~30 s here); ``FUZZ_N=1500`` runs more (1,500 passed, 2026-12-06).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import io
import json
import os
import signal
import socket
import sys
import tempfile
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_hostile_results import BUILTIN, HOSTILE_TEXT, job_doc, reader_argv

from chaos.cli import main as cli

SECONDS = 20     # per reader and input (the slowest, an HTML page of the built-in document, takes ~0.5 s)
PEAK_MIB = 256   # Python memory per reader and input (the documents are ~30 kB; the page ~2 MB)
CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))] + [
    "\u202e", "\u2066", "\u200f"]
INJECTION = "</script><script>alert(1)</script>"
READERS = ("report", "replay", "findings", "repro", "ci")


class TooSlow(BaseException):
    """Raised by the alarm: a BaseException, so that no reader's ``except Exception`` swallows it."""


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of ``doc`` (dict keys and list indices), the root excluded."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append((*prefix, key))
        out += _paths(value, (*prefix, key))
    return out


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


HOSTILE_STRINGS = st.sampled_from([
    HOSTILE_TEXT, INJECTION, "\ud800", "x" * 100_000, "", "-h", "--yes", "{out}", "| `a` *b* _c_ [d](e)",
    "rank0:op1:after", "rank0:op1:after@write:../../etc/passwd:1", "disk:full:" + "9" * 5000, "fail", "pass",
    "hard_failure", "/dev/zero", "a\nb\r\nc",
])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), HOSTILE_STRINGS)
VALUES = st.one_of(
    SCALARS,
    st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.one_of(st.text(max_size=6), HOSTILE_STRINGS), inner, max_size=3), max_leaves=6),
    st.integers(min_value=60, max_value=300).map(_nested),
)


def _same_type(value: Any) -> st.SearchStrategy[Any]:
    """A hostile value of the JSON type ``value`` has: what the schema lets through to the renderers."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(), st.integers(min_value=10**30), st.sampled_from([0, -1, 2**63]))
    if isinstance(value, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(value, str):
        return st.one_of(HOSTILE_STRINGS, st.text(max_size=30), st.just(value + HOSTILE_TEXT))
    if isinstance(value, list):
        return st.one_of(st.just([]), st.just(value * 3), st.just(value[::-1]))
    if isinstance(value, dict):
        return st.dictionaries(HOSTILE_STRINGS, st.just(next(iter(value.values()), None)), max_size=2).map(
            lambda extra: {**value, **extra})
    return st.none()


def _base_docs() -> dict[str, dict[str, Any]]:
    builtin = json.loads(BUILTIN.read_text())
    return {"builtin": builtin, "job": job_doc(Path("/nowhere"))}


BASES = _base_docs()
PATHS = {name: _paths(doc) for name, doc in BASES.items()}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, Any]:
    """(base name, a copy of that document with one to three values removed, replaced by anything, or
    replaced by a hostile value of the same JSON type)."""
    name = draw(st.sampled_from(sorted(BASES)))
    doc = copy.deepcopy(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[name]))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            how = draw(st.sampled_from(["remove", "any", "same type", "same type"]))
            if how == "remove" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif how == "any":
                parent[path[-1]] = draw(VALUES)
            else:
                parent[path[-1]] = draw(_same_type(parent[path[-1]]))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced this path
    return name, doc


FILE_KINDS = ("fifo", "link-to-fifo", "socket", "directory", "dev-null", "link-to-dev-zero", "dangling-link",
              "link-loop")
INPUTS = st.one_of(
    mutated().map(lambda m: ("doc", m)),
    st.binary(max_size=300).map(lambda b: ("bytes", b)),
    st.integers(min_value=1_000, max_value=200_000).map(lambda n: ("bytes", b"[" * n + b"]" * n)),
    st.just(("bytes", b'{"scenarios": [{"id": "a", "verdict": "fail", "seed": 1' + b"0" * 5000 + b"}]}")),
    st.sampled_from(FILE_KINDS).map(lambda k: ("kind", k)),
)


def _make_input(given: tuple[str, Any], where: Path) -> Path:
    form, value = given
    path = where / "results.json"
    if form == "doc":
        path.write_text(json.dumps(value[1]))
    elif form == "bytes":
        path.write_bytes(value)
    elif value == "fifo":
        os.mkfifo(path)
    elif value == "link-to-fifo":
        os.mkfifo(where / "fifo")
        path.symlink_to(where / "fifo")
    elif value == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif value == "directory":
        path.mkdir()
    elif value == "dev-null":
        path.symlink_to("/dev/null")
    elif value == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif value == "dangling-link":
        path.symlink_to(where / "absent.json")
    elif value == "link-loop":
        path.symlink_to(where / "loop.json")
        (where / "loop.json").symlink_to(path)
    return path


def _ci(path: Path, where: Path) -> tuple[int, str]:
    """``--junit`` and ``--summary`` of a document the schema accepts (what chaos run writes them from)."""
    from chaos.errors import ConfigError
    from chaos.model.resultschema import load_results
    from reports.junit import write_junit
    from reports.summary import append_summary

    try:
        doc = load_results(path)
    except ConfigError as exc:
        print(f"chaos: error: {exc}", file=sys.stderr)
        return 2, ""
    write_junit(doc, where / "junit.xml")
    append_summary(doc, where / "summary.md")
    ET.parse(where / "junit.xml")  # well-formed whatever the ids hold
    return 0, (where / "summary.md").read_text(encoding="utf-8", errors="backslashreplace")


# The names ``REPRO_TEMPLATE`` fills in from the results (chaos.cli.repro).
DATA_SLOTS = {"POINT", "POINT_ARG", "JOB_NAME", "SOURCE", "SEED", "EXPECTED", "RECORDED_SUMMARY", "OPTIONS",
              "COMMAND", "CWD", "JOB_SCRIPT", "HARNESS_PYTHON", "JOB_PYTHON"}


def _shape(script: str) -> str:
    """The code of a generated repro script with its data slots (each a literal) and every other
    literal blanked: what no value of a results file may change."""
    tree = ast.parse(script)
    slots = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in DATA_SLOTS:
            ast.literal_eval(node.value)  # a literal, not an expression that could run something
            node.value = ast.Constant(None)
            slots.add(node.targets[0].id)
    assert slots == DATA_SLOTS, slots
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = None
    return ast.dump(tree)


@functools.cache
def repro_shape(base: Path) -> str:
    """The shape of the repro script of the untouched job document (written under ``base``)."""
    where = Path(tempfile.mkdtemp(dir=base))
    (where / "R.json").write_text(json.dumps(BASES["job"]))
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["repro", str(where / "R.json"), "--out", str(where / "d")]) == 0
    return _shape((where / "d" / "repro.py").read_text())


def _alarm(signum: int, frame: Any) -> None:
    raise TooSlow


@settings(max_examples=int(os.environ.get("FUZZ_N", 150)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow, HealthCheck.data_too_large])
@given(source=INPUTS, reader=st.sampled_from(READERS))
def test_every_reader_ends_in_a_result_or_one_error_line(tmp_path_factory, source, reader):
    where = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    path = _make_input(source, where)
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if reader == "ci":
                code, written = _ci(path, where)
            else:
                code, written = cli.main(reader_argv(reader, path, where)), ""
        peak = tracemalloc.get_traced_memory()[1]
    except TooSlow:
        pytest.fail(f"chaos {reader} took over {SECONDS} s on {source[0]} {str(source[1])[:200]}")
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    stdout, stderr = out.getvalue(), err.getvalue()
    shown = stdout + stderr + written
    event(f"{reader} exit {code}")
    assert peak < PEAK_MIB * 2**20, f"{peak / 2**20:.0f} MiB"
    assert code in (0, 2), (code, stdout[-500:], stderr[-500:])
    assert "Traceback" not in shown and "harness error" not in stderr, stderr[-2000:]
    leaked = sorted({c for c in CONTROLS if c in shown})
    assert not leaked, f"control characters {leaked!r} reached the output"
    if code == 2:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chaos: error: ") and str(path) in lines[0], stderr[-2000:]
        return
    if reader == "report":
        page = (where / "r.html").read_text(encoding="utf-8", errors="backslashreplace")
        assert INJECTION not in page
    elif reader == "repro":
        assert _shape((where / "repro-out" / "repro.py").read_text()) == repro_shape(tmp_path_factory.getbasetemp())
    elif reader == "replay":
        assert all(line.startswith("chaos replay: ") for line in stdout.splitlines()), stdout[:500]
