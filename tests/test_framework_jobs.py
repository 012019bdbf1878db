"""The framework jobs of ``chaos/examples/frameworks/`` and the ``frameworks`` extra that installs them.

Fast checks only. The static ones need no framework: every job is a plain script that
takes its output directory as ``--out`` (so a COMMAND carries ``{out}``), imports the
probe only optionally (the job runs without this project installed), and the extra pins
exact versions of everything the jobs import. The rest run where the extra is installed
and skip with the reason where it is not (the default test run and CI do not need it):
the installed versions are the pinned ones (the findings name them), and the torchtitan
rule the FSDP2 job resumes by is checked on real folders.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / "chaos" / "examples" / "frameworks"
JOBS = {  # script -> the framework distributions it imports
    "hf_trainer.py": ("transformers",),
    "lightning_trainer.py": ("lightning",),
    "fabric_loop.py": ("lightning",),
    "accelerate_loop.py": ("accelerate",),
    "fsdp2_dcp.py": ("torchdata",),
}
EXTRA = "pip install -e '.[frameworks]'"


def _pins() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["frameworks"]
    pins = {}
    for req in extra:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+-]*)", req)
        assert m, f"frameworks extra: {req!r} is not pinned to one exact version"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_folder_holds_exactly_the_listed_jobs():
    scripts = {p.name for p in FRAMEWORKS.glob("*.py") if p.name != "__init__.py"}
    assert scripts == set(JOBS)


@pytest.mark.parametrize("script", sorted(JOBS))
def test_each_job_takes_out_and_imports_the_probe_only_optionally(script):
    tree = ast.parse((FRAMEWORKS / script).read_text(), filename=script)
    assert ast.get_docstring(tree), f"{script}: no module docstring saying how to run it"
    outs = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"
            and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "--out"]
    assert outs and any(k.arg == "required" and getattr(k.value, "value", None) is True for k in outs[0].keywords), \
        f"{script}: --out must be a required argument (COMMAND carries {{out}} there)"
    probe_imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "chaos"]
    assert probe_imports, f"{script}: no optional chaos.probe import"
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.Try)
               and any(isinstance(b, ast.ImportFrom) and b.module == "chaos" for b in n.body)
               and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in n.handlers)]
    assert len(guarded) == len(probe_imports), f"{script}: chaos.probe must be imported inside try/except ImportError"
    harness = [n for n in ast.walk(tree) if (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "chaos"
                                             and (n.module != "chaos" or [a.name for a in n.names] != ["probe"]))
               or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "chaos" for a in n.names))]
    assert not harness, f"{script}: a framework job may use chaos.probe only"


def test_the_frameworks_extra_pins_every_framework_the_jobs_import():
    pins = _pins()
    wanted = {d for dists in JOBS.values() for d in dists}
    assert wanted <= set(pins), f"frameworks extra lacks {sorted(wanted - set(pins))}"
    for script, dists in JOBS.items():
        tree = ast.parse((FRAMEWORKS / script).read_text())
        imported = _imports(tree)
        for dist in dists:
            assert dist in imported, f"{script} is listed as importing {dist} but does not"


def _installed(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed: the framework jobs need the frameworks extra ({EXTRA})")


@pytest.mark.parametrize("dist", ["transformers", "lightning", "accelerate", "torchdata"])
def test_the_installed_framework_is_the_pinned_version(dist):
    version = _installed(dist)
    assert version.split("+")[0] == _pins()[dist], (
        f"{dist} {version} is installed but the frameworks extra pins {_pins()[dist]}: the findings "
        "of suites/test_framework_*.py name the pinned version")


def _load_fsdp2_job():
    pytest.importorskip("torchdata", reason=f"torchdata is not installed: the FSDP2 job needs the frameworks "
                                            f"extra ({EXTRA})")
    spec = importlib.util.spec_from_file_location("fsdp2_dcp_job", FRAMEWORKS / "fsdp2_dcp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fsdp2_job_resumes_from_the_newest_step_folder_with_a_metadata_file(tmp_path):
    """torchtitan's rule: a ``step-N`` folder counts only once DCP wrote its ``.metadata``
    (the commit marker), so a save cut short is passed over, whatever its number."""
    job = _load_fsdp2_job()
    folder = tmp_path / "checkpoint"
    assert job.newest_complete(str(folder)) is None
    for step, committed in ((2, True), (4, True), (6, False)):
        d = folder / f"step-{step}"
        d.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(b"shard")
        if committed:
            (d / ".metadata").write_bytes(b"meta")
    (folder / "step-10.tmp").mkdir()  # not a step-N folder
    os.mkdir(folder / "step-8")
    (folder / "step-8" / ".metadata").mkdir()  # a directory named .metadata is no commit marker
    assert job.newest_complete(str(folder)) == 4
    (folder / "step-6" / ".metadata").write_bytes(b"meta")
    assert job.newest_complete(str(folder)) == 6
    assert "fsdp2_dcp_job" not in sys.modules
