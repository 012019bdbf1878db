"""``chaos bench [save|launch|crashstates|job|scale]``: every benchmark under one subcommand.

``chaos bench [options]`` is ``chaos bench save [options]``, as it always was. The old
top-level names (``bench-launch``, ``bench-crashstates``, ``bench-job``, ``bench-scale``)
stay as hidden aliases for a release (:data:`ALIASES`), so scripts and CI jobs written
against them keep working while ``chaos --help`` lists one ``bench``.

Registered by ``chaos.cli.main`` (NAME, HELP, add_arguments, run, like every subcommand
module); each benchmark's own module (``chaos.bench.save`` ...) keeps its options and run.
"""

from __future__ import annotations

import argparse
import importlib

from chaos.bench import save

NAME = "bench"
HELP = "benchmarks: save (the default: reference vs DCP vs torch.save vs the disk), launch, crashstates, job, scale"

SUBCOMMANDS = {
    "save": "chaos.bench.save",
    "launch": "chaos.bench.launch",
    "crashstates": "chaos.bench.crashstates",
    "job": "chaos.bench.job",
    "scale": "chaos.bench.scale",
}
# old top-level name -> its subcommand here (hidden from --help; kept for a release)
ALIASES = {"bench-launch": "launch", "bench-crashstates": "crashstates", "bench-job": "job", "bench-scale": "scale"}


def module(name: str) -> object:
    """The module of benchmark ``name`` (a key of :data:`SUBCOMMANDS`)."""
    return importlib.import_module(SUBCOMMANDS[name])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    save.add_arguments(parser)  # `chaos bench [options]`: the save benchmark, as before
    sub = parser.add_subparsers(dest="bench", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name in SUBCOMMANDS:
        m = module(name)
        p = sub.add_parser(name, help=m.HELP)
        m.add_arguments(p)
        p.set_defaults(handler=m.run)


run = save.run  # a bare `chaos bench`; each subcommand's parser sets its own benchmark's run
