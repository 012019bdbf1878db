"""``chaos bench save|launch|crashstates|job|scale``: one command for every benchmark.

The five benchmarks were five top-level subcommands; they are one ``bench`` now, its
first (``save``) also what a bare ``chaos bench`` runs, as before. The old names stay
as hidden aliases for a release: they parse as they did and run the same benchmark, but
``chaos --help`` lists only ``bench``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from chaos.bench.command import ALIASES, SUBCOMMANDS
from chaos.cli.main import make_parser


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_benchmark_is_a_subcommand_of_bench(name: str) -> None:
    args = make_parser().parse_args(["bench", name])
    assert args.handler is importlib.import_module(SUBCOMMANDS[name]).run


def test_a_bare_chaos_bench_is_the_save_benchmark_with_its_options() -> None:
    args = make_parser().parse_args(["bench", "--size-mb", "3", "--repeats", "2"])
    assert args.handler is importlib.import_module("chaos.bench.save").run
    assert (args.size_mb, args.repeats) == (3, 2)


@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_the_old_names_are_hidden_aliases_of_the_same_benchmark(old: str, new: str) -> None:
    assert make_parser().parse_args([old]).handler is importlib.import_module(SUBCOMMANDS[new]).run


def test_chaos_help_lists_one_bench_and_no_old_name() -> None:
    out = subprocess.run([sys.executable, "-m", "chaos.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("    ") and line.split()]
    assert "bench" in listed and not set(ALIASES) & set(listed), listed
    assert "bench-" not in out.stdout
