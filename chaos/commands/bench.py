"""`chaos bench`: compare the reference checkpointer with DCP, torch.save and raw disk.

    chaos bench                      # ~100 MB state, 2 ranks, all built-in checkpointers
    chaos bench --large              # ~1 GB
    chaos bench --size-mb 20 --only reference,dcp --json out.json --markdown out.md
    chaos bench --workload parallel=fsdp --world-size 4   # sharded FSDP2 state, reference vs DCP
                                                          # per repeat, plus a 4 -> 2 resharded load
"""

from __future__ import annotations

import argparse

from chaos import bench

NAME = "bench"
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
    parser.add_argument("--world-size", type=int, default=2,
                        help="number of gloo ranks (default 2); fsdp also loads resharded at half of them")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median counts (default 3)")
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir); the disk being measured")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the report as JSON")
    parser.add_argument("--markdown", metavar="PATH", default=None, help="also write the report as Markdown")


def run(args: argparse.Namespace) -> int:
    """Bad sizes print one line and return 2; a bad --workload raises ConfigError (chaos.cli: exit 2)."""
    from chaos.errors import ConfigError
    from chaos.scenario import key_values

    overrides = key_values(getattr(args, "workload", []), "--workload")
    parallel = str(overrides.pop("parallel", "ddp"))
    if parallel == "fsdp" and args.only is not None:
        raise ConfigError("chaos bench --workload parallel=fsdp always compares reference, reference-async, dcp "
                          "and dcp-async: --only does not apply")
    only = args.only if args.only is not None else ",".join(bench.DEFAULT_CHECKPOINTERS)
    names = tuple(n.strip() for n in only.split(",") if n.strip())
    if not names or args.world_size < 1 or args.repeats < 1 or (not args.large and args.size_mb <= 0):
        print("error: need at least one checkpointer, a positive size, world size and repeat count")
        return 2
    cfg = bench.BenchConfig(size_mb=1000.0 if args.large else args.size_mb, world_size=args.world_size,
                            checkpointers=names, repeats=args.repeats, root=args.dir, parallel=parallel,
                            workload=overrides)
    report = bench.run_bench(cfg)
    bench.print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            f.write(bench.dumps(report))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(bench.to_markdown(report))
    return 0 if all(r.get("skipped") or r["correct"] for r in report["results"]) else 1
