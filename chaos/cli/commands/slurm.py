"""`chaos slurm start | stop | status`: a private one-node Slurm cluster on this host.

No Slurm runs on a fresh CI machine; as root (with Debian's ``slurm-wlm`` and ``munge``
installed) this starts ``munged``, ``slurmctld`` and ``slurmd`` with every file of theirs
under ``--root`` (default ``/run/chaos-slurm`` or ``CHAOS_SLURM_ROOT``) and prints the
``SLURM_CONF`` the client commands need. ``stop`` cancels every job, stops the daemons
and deletes the root: no daemon, no state left::

    eval "$(chaos slurm start)" && sbatch --wrap hostname && chaos slurm stop

Against a real cluster nothing is started: the user's own ``SLURM_CONF`` and ``sbatch``
are used. The cluster itself is :class:`chaos.launch.slurmcluster.PrivateSlurm`. Without
root, or without the daemons, ``start`` refuses in one line (exit 2).
"""

from __future__ import annotations

import argparse
import json

from chaos.errors import ConfigError

NAME = "slurm"
HELP = "start, stop or inspect a private one-node Slurm cluster (root; slurm-wlm and munge installed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="the cluster's own directory (default: $CHAOS_SLURM_ROOT or /run/chaos-slurm)")
    parser.add_argument("--json", action="store_true", help="print the cluster's status as JSON")


def run(args: argparse.Namespace) -> int:
    """Carry out the action; a cluster that cannot start is a one-line error (exit 2)."""
    from chaos.launch.slurmcluster import PrivateSlurm, SlurmUnavailable

    cluster = PrivateSlurm(args.root)
    if args.action == "start":
        try:
            cluster.start()
        except SlurmUnavailable as exc:
            raise ConfigError(f"cannot start a Slurm cluster: {exc}") from None
        info = cluster.status()
    elif args.action == "stop":
        info = cluster.stop()
    else:
        info = cluster.status()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    elif args.action == "start":
        print(f"export SLURM_CONF={info['conf']}")
        print(f"# chaos slurm: running ({info.get('nodes', '?')}); `chaos slurm stop` removes it")
    elif args.action == "status":
        state = f"running: node {info['nodes']}, {info['jobs']} job(s)" if info["running"] else "not running"
        print(f"slurm at {info['root']}: {state}")
        if info["running"]:
            print(f"export SLURM_CONF={info['conf']}")
    else:
        stopped = ", ".join(f"{n} {p}" for n, p in info["stopped"].items()) or "nothing was running"
        gone = "removed" if not info.get("not_removed") else info["not_removed"]
        print(f"slurm at {info['root']} stopped ({stopped}); root {gone}")
    return 0
