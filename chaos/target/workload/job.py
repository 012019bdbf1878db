"""The built-in workload as an unmodified job: ``python -m chaos.target.workload OUT [options]``.

Why: the harness has two targets, a checkpointer inside the built-in workload and a user's
own job, and issue #28 makes the job the first-class one. This entry runs the very same
training loop (``train.train``: the transformer, AdamW, the LR schedule, the data
position, every RNG, DDP or FSDP2) as a plain program a launcher starts, so the job
pipeline attacks any checkpointer with it exactly as it attacks a user's script:

    chaos run --ranks 2 --result-file 'final-rank*.json' -- \\
        python -m chaos.target.workload {out} --checkpointer reference --steps 8 --save-every 2

It speaks through ``chaos.probe`` (each step and its loss, each acknowledged save, the
resume, the final state's fingerprint), which the job judge reads, and writes
``OUT/final-rank<R>.json`` (the step and the fingerprint of every leaf of the final state)
for ``--result-file``: a resume that loses optimizer moments, the LR schedule or an RNG
ends with another fingerprint, so a fault-free run and a resumed one compare bit for bit.
Checkpoints go to ``OUT/ckpt``. The rendezvous is the launcher's (``env://``: torchrun,
or ``chaos run --ranks N``); one process without one is world size 1.

Options are the built-in ``chaos run``'s: ``--checkpointer`` (``reference``, ``dcp``,
``torch_save``, ``pkg.module:Class`` or ``path/file.py:Class``), ``--steps``,
``--save-every``, ``--seed``, ``--workload KEY=VALUE``, ``--ckpt-opt KEY=VALUE``; and
``--log-dir`` for the workload's own event log (none by default: anything written under
OUT would be traced as the job's own file events).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback

from chaos.errors import ConfigError
from chaos.model.keyvalue import key_values
from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.spec import EXIT_FAILED, RankSpec

EXIT_USAGE = 2
MODULE = "chaos.target.workload"  # what ``python -m`` runs
RESULT_FILES = "final-rank*.json"  # what each rank writes at the end, for ``--result-file``


def command(checkpointer: str, *options: str) -> list[str]:
    """The workload as a job's COMMAND (``{out}`` its output directory) attacking ``checkpointer``
    (a validated spec: a file's path absolute); ``options`` are this entry's own (``--steps 8``).
    Called by ``chaos run --as-job`` (``chaos.cli.asjob``) and the self-check's job half
    (``chaos.run.jobselfcheck``), so both run the one program the same way."""
    return [sys.executable, "-m", MODULE, "{out}", "--checkpointer", checkpointer, *options]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos.target.workload",
                                description="The built-in training workload as a plain job.")
    p.add_argument("out", help="the job's output directory: checkpoints in OUT/ckpt, OUT/final-rank<R>.json")
    p.add_argument("--checkpointer", default="reference", help="the checkpointer under test (default: reference)")
    defaults = WorkloadConfig()
    p.add_argument("--steps", type=int, default=defaults.steps, help="training steps")
    p.add_argument("--save-every", type=int, default=defaults.save_every, help="save every N steps (0: never)")
    p.add_argument("--seed", type=int, default=defaults.seed, help="the workload's seed")
    p.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE", help="a workload setting")
    p.add_argument("--ckpt-opt", action="append", default=[], metavar="KEY=VALUE", help="a checkpointer option")
    p.add_argument("--log-dir", help="where the workload's event log goes (default: nowhere)")
    return p


def config(args: argparse.Namespace) -> WorkloadConfig:
    """The workload's settings from ``--workload KEY=VALUE``, ``--seed``, ``--steps`` and ``--save-every``
    (ConfigError on an unknown key). Called by :func:`main`, and by ``chaos run --as-job``
    (``chaos.cli.asjob``), whose built-in options have the same names, to refuse bad input before
    any rank starts."""
    overrides = key_values(args.workload, "--workload")
    try:
        return WorkloadConfig(**{**overrides, "seed": args.seed, "steps": args.steps, "save_every": args.save_every})
    except TypeError as exc:
        raise ConfigError(f"--workload: {exc}") from None


def _rendezvous() -> tuple[int, int, str, int]:
    """(rank, world size, address, port) from the launcher's environment; one process without one."""
    if "RANK" not in os.environ:
        with socket.socket() as s:  # world size 1: a store of our own on a free port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        return (int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")),
                os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")))
    except ValueError as exc:
        raise ConfigError(f"the launcher's RANK / WORLD_SIZE / MASTER_PORT are not numbers: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = config(args)
        rank, world, addr, port = _rendezvous()
        cfg.check_world_size(world)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    log_path = os.devnull
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        log_path = os.path.join(args.log_dir, f"rank{rank}.jsonl")
    spec = RankSpec(rank=rank, world_size=world, attempt=0, master_addr=addr, master_port=port,
                    workload=cfg.to_dict(), log_path=log_path, checkpointer=args.checkpointer,
                    ckpt_options=key_values(args.ckpt_opt, "--ckpt-opt"), ckpt_root=os.path.join(out, "ckpt"),
                    init_method="env://")
    from chaos.target.workload.log import EventLog
    from chaos.target.workload.train import train  # torch: only once the arguments are good

    log = EventLog(spec.log_path, rank, 0)
    try:
        final = train(spec, None, log)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:  # noqa: BLE001 - the job's output is what the harness reads
        traceback.print_exc()
        return EXIT_FAILED
    finally:
        log.close()
    path = os.path.join(out, f"final-rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(final, f, sort_keys=True, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return 0


__all__ = ["MODULE", "RESULT_FILES", "command", "config", "main"]
