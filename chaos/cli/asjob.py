"""``chaos run --as-job [options]``: the built-in workload attacked as one job among others.

Why (issue #28): the harness has a pipeline for its built-in workload and one for a user's
job, and the job's is the one meant to remain. This flag sends the built-in ``chaos run``'s
options through the job pipeline unchanged in meaning: the workload becomes the COMMAND
``python -m chaos.target.workload {out} --checkpointer ...`` (``chaos.target.workload.job``),
started on ``--world-size`` ranks, and judged by its result files (``final-rank*.json``: the
final state's fingerprint, leaf by leaf) and its probe (steps, losses, acknowledged saves).
Every job fault family applies to it, at every file event of the whole run, not only inside
one save: that is how the reference checkpointer's root directory was found not durable
(2026-12-07).

Called by ``chaos.cli.main.main`` when ``run``'s arguments hold ``--as-job``; the options
``run`` does not know (``--max-points``, ``--faults``, ``--jobs`` ...) are the job mode's own
and pass through. ``--hang-timeout`` keeps its built-in meaning (no progress for S seconds is a
hang, 60 by default) through the job mode's own (``chaos.launch.silence``), and ``--driver docker``
runs every rank as a container (``--launcher docker``, ``chaos.launch.containers``; with ``--image``
its own Python, ``python3``, runs the workload there). Each ``--fault`` becomes a ``--point`` as
written: a kill, SIGTERM, hang or cut at a step or phase, or an I/O fault whose interposer rule
the job's tracer fires (``chaos.model.grammar.parse_point``). Returns the job
mode's argument list (``chaos.cli.job.main``). A built-in
option the job pipeline cannot honour is refused in one line, never ignored.
"""

from __future__ import annotations

import argparse

from chaos.cli.job import output_options
from chaos.errors import ConfigError
from chaos.model.keyvalue import key_values
from chaos.target.protocol import validate_spec
from chaos.target.workload import job as workload

DEFAULT_POINTS = 12  # without --max-points, --budget or --point: about a minute and a half on 2 CPU ranks


def _refuse(args: argparse.Namespace) -> None:
    """A ConfigError for each built-in option the job pipeline has no way to honour."""
    refused = [(args.device not in (None, "cpu"), f"--device {args.device}"),
               (args.cache_dir is not None, "--cache-dir"), (args.no_cache, "--no-cache")]
    said = [flag for bad, flag in refused if bad]
    if said:
        raise ConfigError(f"--as-job cannot take {', '.join(said)}: the job pipeline runs the workload on this "
                          "host's CPUs, as processes or (--driver docker) containers of the host-mounted empty "
                          "image, without the built-in golden cache")


def workload_command(args: argparse.Namespace) -> list[str]:
    """The workload as the job's COMMAND, with the built-in run's checkpointer and workload options."""
    workload.config(args)  # an unknown --workload key: refused here, not in every rank
    command = workload.command(validate_spec(args.checkpointer), "--steps", str(args.steps), "--save-every",
                               str(args.save_every), "--seed", str(args.seed))
    if args.image is not None:
        command[0] = "python3"  # the image's own Python, as the built-in docker driver's ranks run
    for kv in args.workload:
        command += ["--workload", kv]
    key_values(args.ckpt_opt, "--ckpt-opt")  # malformed: refused here, not in every rank
    for kv in args.ckpt_opt:
        command += ["--ckpt-opt", kv]
    return command


def job_argv(args: argparse.Namespace, rest: list[str]) -> list[str]:
    """``chaos run`` job-mode arguments for the built-in ``args``; ``rest``, the arguments ``run`` did not
    know, go before the COMMAND, where the job mode's parser reads (or refuses) them."""
    _refuse(args)
    out = ["--ranks", str(args.world_size), "--result-file", workload.RESULT_FILES, "--max-restarts", str(args.max_restarts),
           "--seed", str(args.seed), "--hang-timeout", repr(args.hang_timeout)]
    if args.driver == "docker":  # each rank a container of its own (chaos.launch.containers)
        out += ["--launcher", "docker"]
    if args.image is not None:  # the job mode refuses it without --launcher docker, as the built-in run does
        out += ["--image", args.image]
    out += output_options(args)
    if args.loss_band is not None:
        out += ["--loss-band", str(args.loss_band)]
    if args.budget:
        out += ["--budget", str(args.budget)]
    for spec in args.fault:
        out += ["--point", spec]
    chosen = args.fault or args.budget or any(a == f or a.startswith(f + "=") for a in rest
                                              for f in ("--max-points", "--budget", "--point"))
    if not chosen:
        out += ["--max-points", str(DEFAULT_POINTS)]
    return [*out, *rest, "--", *workload_command(args)]


__all__ = ["DEFAULT_POINTS", "job_argv", "workload_command"]
