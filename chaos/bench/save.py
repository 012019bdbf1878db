"""`chaos bench`: compare the reference checkpointer with DCP, torch.save and raw disk.

    chaos bench                      # ~100 MB state, 2 ranks, all built-in checkpointers, 7 repeats
    chaos bench --repeats 3          # a quicker look: min / median / max over 3
    chaos bench --large              # ~1 GB
    chaos bench --size-mb 20 --only reference,dcp --json out.json --markdown out.md
    chaos bench --device cuda        # the state on one GPU per rank: async snapshots from device memory
    chaos bench --workload parallel=fsdp --world-size 4   # sharded FSDP2 state, reference vs DCP
                                                          # per repeat, plus a 4 -> 2 resharded load

Compared checkpointers run back to back in every repeat (which goes first alternates)
and every ratio is computed per repeat pair, then reported as min / median / max.
This module picks the bench (:func:`run_bench`: ``chaos.bench.checkpoint`` for replicated state,
``chaos.bench.sharded`` for ``parallel=fsdp``) and renders both reports; ``chaos
bench-scale`` (``chaos.bench.scale``) calls :func:`run_bench` too.
"""

from __future__ import annotations

import argparse
from typing import Any

from chaos.bench import checkpoint as bench
from chaos.bench import sharded as bench_sharded

NAME = "save"  # `chaos bench save`, and a bare `chaos bench`
HELP = "benchmark save/load of the reference checkpointer against DCP, torch.save and raw disk"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--size-mb", type=float, default=100.0, help="state size in MB (default 100): ddp, the replicated state every "
                      "rank holds; fsdp, the sharded state of all ranks together")
    size.add_argument("--large", action="store_true", help="use a ~1 GB state")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated checkpointers (default: {','.join(bench.DEFAULT_CHECKPOINTERS)}; "
                             "parallel=fsdp always compares reference, reference-async, dcp, dcp-async)")
    parser.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE",
                        help="parallel=ddp (default: replicated synthetic state) or parallel=fsdp (the workload's "
                             "FSDP2 state, sized by --size-mb over all ranks; other workload keys such as "
                             "d_model=, n_layers= apply to fsdp) (repeatable)")
    parser.add_argument("--device", choices=bench.DEVICES, default="cpu",
                        help="where the ddp state lives: cpu (default) or cuda (one GPU per rank, "
                             "CUDA_VISIBLE_DEVICES per rank; async saves snapshot device memory)")
    parser.add_argument("--world-size", type=int, default=2,
                        help="number of gloo ranks (default 2); fsdp also loads resharded at half of them")
    parser.add_argument("--repeats", type=int, default=7,
                        help="repeats (default 7): every figure is min / median / max over them, every ratio "
                             "computed per repeat pair; targets are judged on the median")
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir); the disk being measured")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON")
    parser.add_argument("--markdown", metavar="PATH", default=None, help="also write the report as Markdown")


def config(args: argparse.Namespace) -> bench.BenchConfig:
    """The BenchConfig the arguments ask for; ConfigError (one line, exit 2) for a bad combination."""
    from chaos.errors import ConfigError
    from chaos.model.keyvalue import key_values

    overrides = key_values(getattr(args, "workload", []), "--workload")
    parallel = str(overrides.pop("parallel", "ddp"))
    if parallel == "fsdp" and args.only is not None:
        raise ConfigError("chaos bench --workload parallel=fsdp always compares reference, reference-async, dcp "
                          "and dcp-async: --only does not apply")
    only = args.only if args.only is not None else ",".join(bench.DEFAULT_CHECKPOINTERS)
    names = tuple(dict.fromkeys(n.strip() for n in only.split(",") if n.strip()))
    if not names or args.world_size < 1 or args.repeats < 1 or (not args.large and args.size_mb <= 0):
        raise ConfigError("chaos bench: need at least one checkpointer, a positive size, world size and repeat count")
    return bench.BenchConfig(size_mb=1000.0 if args.large else args.size_mb, world_size=args.world_size,
                             checkpointers=names, repeats=args.repeats, root=args.dir, parallel=parallel,
                             workload=overrides, device=getattr(args, "device", "cpu"))


def run_bench(cfg: bench.BenchConfig) -> dict[str, Any]:
    """Validate ``cfg`` (ConfigError before any rank starts), then run the bench it names; the report."""
    bench_sharded.validate(cfg)
    bench.validate(cfg)
    if cfg.parallel == "fsdp":
        return bench_sharded.run(cfg)
    return bench.run_bench(cfg)


def to_markdown(report: dict[str, Any]) -> str:
    """``chaos.bench.checkpoint``'s Markdown, with the fsdp section when the report has one."""
    text = bench.to_markdown(report)
    if "fsdp" in report:
        text += "\n" + "\n".join(bench_sharded.markdown(report["fsdp"])) + "\n"
    return text


def print_report(report: dict[str, Any]) -> None:
    """Rich tables on a terminal; off one (a CI log, a pipe) the Markdown, which never wraps a cell."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        print(to_markdown(report), end="", flush=True)
        return
    bench.print_report(report, console)
    if "fsdp" in report:
        bench_sharded.print_section(report["fsdp"], console)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every load was bit-exact, 1 when one was not; a bad config raises ConfigError (chaos.cli.main: exit 2)."""
    report = run_bench(config(args))
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            f.write(bench.dumps(report))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(to_markdown(report))
    return 0 if all(r.get("skipped") or r["correct"] for r in report["results"]) else 1
