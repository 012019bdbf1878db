"""What the two CI entry points select: every suite runs somewhere, with what it needs.

``.ci/run`` (per commit) runs pytest's default selection: every test but those marked
``slow`` or ``bench``, which the plugin leaves out unless the ``-m`` expression names them
(``chaos.cli.plugin.pytest_collection_modifyitems``), so the design card's ``pytest suites/ -m
chaos`` is the per-commit set too; ``.ci/nightly`` runs its own ``-m`` after installing the
``frameworks`` extra. The framework suites need that extra, so they must be marked ``frameworks`` and
the nightly's expression must select that marker — otherwise their strict-xfail findings
run nowhere and the framework defects they pin could come back unseen. Read from the
scripts and the suites' source, so a change to either that drops the suites fails here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from chaos.cli.plugin import OPT_IN, opted_in

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
FRAMEWORK_SUITES = sorted((REPO / "suites").glob("test_framework_*.py"))


def _nightly() -> str:
    """The nightly's pytest command line (its comments quote the expression too)."""
    lines = [ln for ln in (REPO / ".ci" / "nightly").read_text().splitlines()
             if not ln.lstrip().startswith("#") and ("-m pytest" in ln or "pip" in ln)]
    assert any("-m pytest" in ln for ln in lines), "no pytest command in .ci/nightly"
    return "\n".join(lines)


def _selection(text: str) -> Expression:
    """The ``-m "EXPR"`` marker expression in ``text``: after ``-m pytest`` where that is there."""
    _, _, after = text.partition("-m pytest")
    m = re.search(r'-m\s+\\?"([^"\\]+)\\?"', after or text)
    assert m, "no -m expression found"
    return Expression.compile(m.group(1))


def _module_marks(path: Path) -> set[str]:
    """The marker names of a module's ``pytestmark`` (``pytest.mark.X`` or a list of them)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return {v.attr for v in values if isinstance(v, ast.Attribute)}
    return set()


def _needed_modules(path: Path) -> set[str]:
    return set(re.findall(r'\bneed\("([\w.]+)"\)', path.read_text()))


def test_there_are_framework_suites():
    assert len(FRAMEWORK_SUITES) >= 5


@pytest.mark.parametrize("suite", FRAMEWORK_SUITES, ids=lambda p: p.name)
def test_every_framework_suite_runs_in_the_nightly_and_only_skips_per_commit(suite):
    marks = _module_marks(suite)
    assert {"chaos", "frameworks"} <= marks, f"{suite.name}: pytestmark {sorted(marks)}"
    nightly = _selection(_nightly())
    assert nightly.evaluate(lambda name: name in marks), "the nightly must select it"
    assert not marks & set(OPT_IN), "per commit it is selected and skips without the extra"


def test_the_nightly_installs_what_the_framework_suites_import():
    assert re.search(r"-e '\.\[dev,frameworks\]'", _nightly()), "the nightly installs the frameworks extra"
    pyproject = (REPO / "pyproject.toml").read_text()
    installed: set[str] = set()
    for section in ("dependencies", "frameworks"):  # the project's own, then the extra's
        block = re.search(rf"^{section} = \[(.*?)^\]", pyproject, re.S | re.M)
        assert block, section
        installed |= {m.group(1).lower() for m in re.finditer(r'^\s*"([A-Za-z0-9_.-]+)[=><]', block.group(1), re.M)}
    needed = set().union(*(_needed_modules(p) for p in FRAMEWORK_SUITES))
    assert {"transformers", "lightning", "accelerate"} <= needed, "the suites name the frameworks they need"
    assert needed <= installed, f"imported by the suites, installed by neither: {sorted(needed - installed)}"


def test_the_selections_still_tell_slow_and_gpu_apart():
    text = _nightly()
    nightly = _selection(text)
    for marks in ({"slow"}, {"gpu"}, {"chaos", "slow"}, {"storage"}):
        assert nightly.evaluate(lambda name, m=marks: name in m)
    assert opted_in(re.search(r'-m\s+"([^"]+)"', text.partition("-m pytest")[2]).group(1)) == {"slow", "bench", "storage"}
    assert not nightly.evaluate(lambda name: name == "bench"), "the nightly names bench only to leave it out"
    assert opted_in("") == set() and opted_in("chaos") == set() and opted_in("not slowish") == set()


def _collected(*args: str) -> set[str]:
    env = dict(os.environ, CHAOS_SKIP_ESCAPE_CHECK="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 5), out.stdout[-2000:] + out.stderr[-2000:]
    return {ln for ln in out.stdout.splitlines() if "::" in ln}


def test_the_documented_ci_command_selects_the_per_commit_set_not_the_slow_campaigns():
    """``pytest suites/ -m chaos``: a command-line -m once replaced addopts' "not slow" and
    selected the long campaigns; the plugin now leaves them out whatever -m says."""
    documented = _collected("suites/", "-m", "chaos")
    slow = _collected("suites/", "-m", "chaos and slow")
    per_commit = _collected("suites/", "-m", "chaos and not slow and not bench")
    assert slow, "no slow chaos suite to leave out: nothing tested"
    assert documented == per_commit and not documented & slow


def test_a_quiet_run_prints_no_xfail_reasons(pytester):
    """``-q`` once printed every strict xfail's long reason (17 KB on the framework suites)."""
    addopts = re.search(r'^addopts = "([^"]*)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    pytester.makepyfile(test_known=textwrap.dedent("""
        import pytest

        @pytest.mark.xfail(strict=True, raises=AssertionError, reason="a known defect, " * 200)
        def test_known_defect():
            assert False, "the defect"

        @pytest.mark.slow
        def test_long_campaign():
            pass
    """))
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", "-o", f"addopts={addopts}")
    out = result.stdout.str()
    # under addopts' workers (pytest-xdist) the controller reports no "deselected" count: the slow
    # test is simply never run
    assert "1 xfailed" in out and "passed" not in out and "a known defect" not in out, out
    one = pytester.runpytest("-q", "-p", "no:cacheprovider", "-o", f"addopts={addopts}", "-n", "0").stdout.str()
    assert "1 xfailed" in one and "1 deselected" in one and "a known defect" not in one, one
