"""The documentation: README as a front page, and the MkDocs site built strictly.

The site (``mkdocs.yml``, ``docs/``) is built once per session with ``mkdocs build
--strict`` into a temp directory (never into the checkout): a broken link, a broken
anchor, a page missing from the nav or an unknown generated block fails it. The built
HTML is then checked for what the generator hook (``docs/hooks/generate.py``) must put
there, and every ``chaos`` command in a shell block of the docs and README is parsed by
the real parsers, so an example cannot drift from the CLI.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
SETUP_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/chaos run",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest",
)

pytest.importorskip("mkdocs", reason="the docs extra (mkdocs, mkdocs-material) is not installed")
pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")


def _mkdocs(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    had_site = (REPO / "site").exists()
    proc = _mkdocs(REPO / "mkdocs.yml", out, REPO)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert had_site or not (REPO / "site").exists(), "the build wrote site/ into the checkout"
    return out


class _Text(HTMLParser):
    """The text of an HTML page, and the ids of its headings."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if re.fullmatch(r"h[1-6]", tag):
            self.ids.update(v for k, v in attrs if k == "id" and v)

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _page(path: Path) -> _Text:
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_the_site_builds_strictly_outside_the_checkout(site: Path) -> None:
    assert (site / "index.html").is_file()
    for section in ("tutorial", "how-to", "reference", "explanation"):
        assert (site / section / "index.html").is_file(), section


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the front page keeps to 200"
    assert lines[0].startswith("# ")
    code = [line for line in lines[1:6] if line.strip()]
    assert code[:4] == ["```bash", *SETUP_COMMANDS, "```"], "README must open with exactly the two set-up commands"
    first_screen = " ".join(lines[:25]).lower()
    assert "checkpoint" in first_screen and "chaos" in first_screen
    activate = next(i for i, line in enumerate(lines) if ". .venv/bin/activate" in line)
    bare = next(i for i, line in enumerate(lines) if line.startswith("chaos "))
    assert activate < bare, "say how to activate the environment before the first bare `chaos` example"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_in_readme_exists() -> None:
    missing = []
    for target in _LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (REPO / target.split("#", 1)[0]).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"


def _subcommands() -> list[str]:
    import argparse

    from chaos.cli.main import make_parser

    names: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    names.append(f"{prefix} {name}")
                    walk(child, f"{prefix} {name}")

    walk(make_parser(), "chaos")
    return names


def test_the_cli_reference_lists_every_subcommand(site: Path) -> None:
    page = _page(site / "reference" / "cli.html")
    text = " ".join(page.parts)
    names = _subcommands()
    assert "chaos run" in names and "chaos bench job" in names
    missing = [n for n in names if n not in text]
    assert not missing, f"the generated CLI reference lacks {missing}"
    assert "chaos-run-job-options-command" in page.ids  # the job options of `chaos run -- COMMAND`
    from chaos.cli import job

    for action in job.make_parser()._actions:
        for option in action.option_strings:
            assert option in text, f"job option {option} missing from the CLI reference"


def test_generated_blocks_are_filled_in(site: Path) -> None:
    from chaos.model.jobspec import FAULT_KINDS as JOB_FAMILIES
    from chaos.plan.scenario import FAULT_KINDS

    faults = " ".join(_page(site / "reference" / "faults.html").parts)
    for name in (*FAULT_KINDS, *JOB_FAMILIES):
        assert name in faults, f"fault {name} missing from the faults reference"
    results = " ".join(_page(site / "reference" / "results.html").parts)
    assert "$.scenarios[].verdict" in results
    for page in site.rglob("*.html"):
        assert "<!-- generate:" not in page.read_text(encoding="utf-8"), f"{page}: a generated block was left unfilled"


def test_a_page_missing_from_the_nav_or_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The project's own validation settings turn an orphan page and a dead link into errors."""
    import yaml

    validation = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["validation"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[a page](page.md)\n")
    (docs / "page.md").write_text("# Page\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({
        "site_name": "t", "docs_dir": "docs", "strict": True, "validation": validation,
        "nav": ["index.md", "page.md"],
    }))
    proc = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert proc.returncode != 0 and "orphan.md" in proc.stderr, proc.stderr
    (docs / "orphan.md").unlink()
    (docs / "index.md").write_text("# Home\n\n[a page](page.md) and [a dead one](gone.md), [an anchor](page.md#nope)\n")
    proc = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert proc.returncode != 0 and "gone.md" in proc.stderr and "nope" in proc.stderr, proc.stderr


def _shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced code blocks marked bash/sh/shell or unmarked."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence:
            if lang in ("", "bash", "sh", "shell"):
                blocks.append("\n".join(body))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def _chaos_commands(text: str) -> list[str]:
    """Every ``chaos ...`` command of the shell blocks in ``text`` (continuations joined)."""
    found = []
    for block in _shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            if not re.search(r"(^|[;&|]|=\S*)\s*chaos\s", line):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set(";&|"):
                    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                        words = words[1:]  # VAR=value chaos ...
                    if words[:1] == ["chaos"]:
                        found.append(shlex.join(words))
                    words = []
                else:
                    words.append(token)
    return found


def _sources() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_every_chaos_command_in_the_docs_parses(capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.cli import job
    from chaos.cli.main import make_parser

    commands = [(path, cmd) for path in _sources() for cmd in _chaos_commands(path.read_text(encoding="utf-8"))]
    assert len(commands) >= 20, commands  # the extraction itself works
    bad = []
    for path, cmd in commands:
        argv = shlex.split(cmd)[1:]
        try:
            if argv[:1] == ["run"] and "--" in argv:
                cut = argv.index("--")
                job.make_parser().parse_args(argv[1:cut])
                assert argv[cut + 1:], "no COMMAND after --"
            elif argv[:1] == ["run"] and "--as-job" in argv:  # its job options too, as the job mode reads them
                from chaos.cli.asjob import job_argv

                translated = job_argv(*make_parser().parse_known_args(argv))
                job.make_parser().parse_args(translated[:translated.index("--")])
            else:
                make_parser().parse_args(argv)
        except SystemExit as exc:  # argparse: 0 after --help, 2 on a bad command line
            if exc.code not in (0, None):
                bad.append(f"{path.relative_to(REPO)}: {cmd}: exit {exc.code}")
        except Exception as exc:  # the job parser raises ConfigError
            bad.append(f"{path.relative_to(REPO)}: {cmd}: {exc}")
    capsys.readouterr()  # what --help printed
    assert not bad, "commands in the docs that the CLI refuses:\n" + "\n".join(bad)


def test_the_hook_escapes_help_text(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    spec = importlib.util.spec_from_file_location("docs_hook_generate", DOCS / "hooks" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.md_text("a *b* <c> `d_e*`") == r"a \*b\* \<c\> `d_e*`"
    assert generate.md_text("x_y") == r"x\_y"


CHEAP = ("interval",)  # subcommands whose examples take about a second and touch nothing: run them


def test_the_cheap_examples_run() -> None:
    commands = sorted({cmd for path in _sources() for cmd in _chaos_commands(path.read_text(encoding="utf-8"))
                       if shlex.split(cmd)[1:2] and shlex.split(cmd)[1] in CHEAP})
    assert commands, "no cheap example found in the docs"
    for cmd in commands:
        proc = subprocess.run([sys.executable, "-m", "chaos.cli", *shlex.split(cmd)[1:]], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
