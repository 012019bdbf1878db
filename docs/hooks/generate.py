"""MkDocs hook: fill in the parts of the docs that the code already says, at build time.

A page asks for a generated block with a marker on a line of its own::

    <!-- generate: cli -->

and :func:`on_page_markdown` replaces the marker with Markdown made from the code: the
argparse parsers (``chaos.cli.main.make_parser`` and the job parser of
``chaos.cli.job``), the results JSON Schema (``chaos.model.resultschema.SCHEMA``), the
``--fault`` kinds (``chaos.model.fault.FAULT_KINDS``), the workload keys
(``chaos.target.workload.config.WorkloadConfig``) and the pytest plugin's options and
markers (``chaos.cli.plugin``). Nothing here is typed by hand, so none of it can go
stale; an unknown marker fails the build.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generate: ([a-z][a-z-]*) -->$", re.MULTILINE)
_SPECIAL = re.compile(r"([\\*_\[\]<>])")


def md_text(text: str) -> str:
    """Plain text (an argparse help string) as Markdown: code spans kept, the rest escaped."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = _SPECIAL.sub(r"\\\1", parts[i])
    return "`".join(parts) if len(parts) % 2 else _SPECIAL.sub(r"\\\1", text)


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ---------------------------------------------------------------------------- the CLI


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def walk(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser, str, bool]]:
    """Every (name, parser, one-line help, hidden) under ``parser``, depth first, ``prog`` first."""
    yield prog, parser, parser.description or "", False
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: (a.help or "") for a in sub._choices_actions}
    for name, child in sub.choices.items():
        full = f"{prog} {name}"
        hidden = name not in helps
        if hidden:
            yield full, child, "", True
            continue
        first = True
        for item in walk(child, full):
            if first:
                item = (item[0], item[1], helps[name], False)
                first = False
            yield item


def _option_term(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return ", ".join(f"`{s}`" for s in action.option_strings)
    if action.choices:
        meta = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        meta = action.metavar or action.dest.upper()
    return ", ".join(f"`{s} {meta}`" for s in action.option_strings)


def _option_text(action: argparse.Action) -> str:
    text = md_text(action.help or "")
    extra = []
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        extra.append("repeatable")
    default = action.default
    if (action.option_strings and action.nargs != 0 and default not in (None, [], argparse.SUPPRESS)
            and "default" not in (action.help or "")):
        extra.append(f"default: `{default}`")
    if action.required and action.option_strings:
        extra.append("required")
    if extra:
        text = f"{text} ({'; '.join(extra)})" if text else "; ".join(extra).capitalize()
    return text or "&nbsp;"


def render_parser(name: str, parser: argparse.ArgumentParser, summary: str, level: int = 2) -> str:
    out = [f"{'#' * level} `{name}` {{#{_anchor(name)}}}", ""]
    if summary:
        out += [md_text(summary[:1].upper() + summary[1:]) + ".", ""]
    usage = parser.format_usage().strip()
    out += ["```text", usage, "```", ""]
    actions = [a for a in parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if actions:
        for action in actions:
            out += [_option_term(action), f":   {_option_text(action)}", ""]
    sub = _subparsers(parser)
    if sub is not None:
        names = ", ".join(f"[`{name} {c}`](#{_anchor(f'{name} {c}')})" for c in sub.choices
                          if c in {a.dest for a in sub._choices_actions})
        out += [f"Subcommands: {names}.", ""]
    return "\n".join(out)


def cli() -> str:
    from chaos.cli import job
    from chaos.cli.main import make_parser

    parser = make_parser()
    out = ["```text", parser.format_help().strip(), "```", ""]
    hidden = []
    for name, child, summary, is_hidden in walk(parser, "chaos"):
        if name == "chaos":
            continue
        if is_hidden:
            hidden.append(name)
            continue
        out.append(render_parser(name, child, summary, level=2 if name.count(" ") == 1 else 3))
        if name == "chaos run":
            out.append(render_parser("chaos run [job options] -- COMMAND...", job.make_parser(),
                                     "run your own training job under chaos: `{out}` in COMMAND is its output "
                                     "directory; these options replace the ones above when `--` is present",
                                     level=3))
    if hidden:
        out += ["## Hidden aliases {#hidden-aliases}", "",
                "Old names kept for a release; not listed by `chaos --help`: "
                + ", ".join(f"`{h}`" for h in hidden) + ".", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- results schema


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    return " or ".join(kinds)


def _schema_rows(node: dict[str, Any], path: str, required: bool) -> Iterator[tuple[str, str, bool]]:
    yield path, _type(node), required
    props = node.get("properties", {})
    need = set(node.get("required", ()))
    for key, child in props.items():
        yield from _schema_rows(child, f"{path}.{key}", key in need)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _schema_rows(extra, f"{path}.<key>", False)
    items = node.get("items")
    if isinstance(items, dict):
        yield from _schema_rows(items, f"{path}[]", False)


def results_schema() -> str:
    from chaos.model.resultschema import SCHEMA

    rows = ["| field | type | required |", "|---|---|---|"]
    for path, kind, required in _schema_rows(SCHEMA, "$", True):
        rows.append(f"| `{path}` | {kind} | {'yes' if required else ''} |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------- faults, workload, pytest


def fault_kinds() -> str:
    from chaos.model.fault import COMMON_KEYS, FAULT_KINDS

    rows = ["| kind | family | needs | keys | what it does |", "|---|---|---|---|---|"]
    for name, kind in FAULT_KINDS.items():
        needs = ", ".join(k for k, on in (("rank", kind.needs_rank), ("step", kind.needs_step)) if on) or "-"
        keys = ", ".join(f"`{k}`" for k in sorted(kind.keys))
        rows.append(f"| `{name}` | {kind.family} | {needs} | {keys} | {md_text(kind.doc)} |")
    common = ", ".join(f"`{k}`" for k in sorted(COMMON_KEYS))
    return "\n".join(rows) + f"\n\nEvery kind also takes {common}.\n"


def job_fault_families() -> str:
    from chaos.model.jobspec import FAULT_KINDS

    return ", ".join(f"`{k}`" for k in FAULT_KINDS)


def workload_keys() -> str:
    from chaos.target.workload import config

    rows = ["| key | type | default |", "|---|---|---|"]
    for f in dataclasses.fields(config.WorkloadConfig):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` | {kind} | `{f.default}` |")
    out = "\n".join(rows) + "\n"
    for label, attr in (("parallel", "PARALLEL_MODES"), ("device", "DEVICES"), ("corpus", "CORPORA")):
        values = getattr(config, attr, None)
        if values:
            out += f"\n`{label}` is one of " + ", ".join(f"`{v}`" for v in values) + "."
    return out + "\n"


class _Options:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def getgroup(self, *args: Any, **kwargs: Any) -> _Options:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self.rows.append((", ".join(names), kwargs))

    def addini(self, *args: Any, **kwargs: Any) -> None:
        pass


def pytest_options() -> str:
    from chaos.cli import plugin

    opts = _Options()
    plugin.pytest_addoption(opts)  # type: ignore[arg-type]
    out = []
    for names, kw in opts.rows:
        meta = "" if kw.get("action") in ("store_true", "store_false") else " " + names.split(",")[0].lstrip("-").upper().replace("-", "_")
        text = md_text(kw.get("help", ""))
        extra = []
        if kw.get("action") == "append" and "repeatable" not in kw.get("help", ""):
            extra.append("repeatable")
        if "choices" in kw:
            extra.append("one of " + ", ".join(f"`{c}`" for c in kw["choices"]))
        if kw.get("default") not in (None, [], "") and "default" not in kw.get("help", ""):
            extra.append(f"default: `{kw['default']}`")
        if extra:
            text = f"{text} ({'; '.join(extra)})" if text else "; ".join(extra).capitalize()
        out += [f"`{names}{meta}`", f":   {text or '&nbsp;'}", ""]
    return "\n".join(out)


def pytest_markers() -> str:
    from chaos.cli import plugin

    rows = ["| marker | meaning |", "|---|---|"]
    for name, text in plugin.MARKERS.items():
        rows.append(f"| `{name}` | {md_text(text).replace('|', chr(92) + '|')} |")
    opt_in = ", ".join(f"`{m}`" for m in getattr(plugin, "OPT_IN", ()))
    return "\n".join(rows) + (f"\n\nOnly run when the `-m` expression names them: {opt_in}.\n" if opt_in else "\n")


_ROLE = re.compile(r":(?:mod|func|class|meth|attr):`~?([^`]+)`")


def fault_families() -> str:
    """One section per fault family of a job (chaos.nemesis.family.families()), from its module's
    docstring: a family added as one module is documented here by that module."""
    import sys

    from chaos.nemesis.family import families

    out = []
    for name, fam in families().items():
        module = fam.points.__module__
        doc = (sys.modules[module].__doc__ or "").strip()
        text = _ROLE.sub(r"`\1`", doc).replace("``", "`")
        head, _, body = text.partition("\n")
        title = head.split(":", 1)[1].strip() if ":" in head else head
        body = re.sub(r"([<>])", r"\\\1", body.strip())  # Markdown as written; no raw HTML
        out.append(f"### `{name}`\n\n{md_text(title)}\n\n{body}\n\n"
                   f"Module: `{module}`.\n")
    return "\n".join(out)


def job_verdict_order() -> str:
    """The job oracles in the order that names a failing point's outcome (chaos.judge.registry)."""
    from chaos.judge.registry import BY_NAME, VERDICT_ORDER

    rows = ["| oracle | it checks | failing outcome |", "|---|---|---|"]
    rows += [f"| `{name}` | {md_text(BY_NAME[name].checks)} | `{outcome}` |" for name, outcome in VERDICT_ORDER]
    return "\n".join(rows) + "\n"


def every_oracle() -> str:
    """One row per oracle of either target (chaos.judge.registry.ORACLES)."""
    from chaos.judge.registry import ORACLES

    rows = ["| oracle | it checks | built-in workload | a job's failing outcome |", "|---|---|---|---|"]
    rows += [f"| `{o.name}` | {md_text(o.checks)} | {'yes' if o.workload else '-'} | "
             f"{f'`{o.job}`' if o.job else '-'} |" for o in ORACLES]
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "fault-families": fault_families,
    "every-oracle": every_oracle,
    "job-verdict-order": job_verdict_order,
    "cli": cli,
    "results-schema": results_schema,
    "fault-kinds": fault_kinds,
    "job-fault-families": job_fault_families,
    "workload-keys": workload_keys,
    "pytest-options": pytest_options,
    "pytest-markers": pytest_markers,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_uri}: unknown generated block {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(fill, markdown)
