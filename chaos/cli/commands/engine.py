"""`chaos engine start | stop | status`: a private Docker engine for ``--driver docker``.

No Docker daemon runs on a fresh CI machine; as root this starts one of our own
(``dockerd --iptables=false --storage-driver=vfs --bridge=none`` with its socket, data
and exec roots under ``--root``, default ``/run/chaos-engine`` or ``CHAOS_ENGINE_ROOT``),
which ``chaos run --driver docker`` then finds by itself. ``stop`` removes every
container, network and volume the harness made, stops the daemon and deletes its root::

    chaos engine start && chaos run --driver docker --fault rank1:step23:kill && chaos engine stop
"""

from __future__ import annotations

import argparse
import json

from chaos.errors import ConfigError

NAME = "engine"
HELP = "start, stop or inspect a private Docker engine for --driver docker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="the engine's own directory (default: $CHAOS_ENGINE_ROOT or /run/chaos-engine)")
    parser.add_argument("--json", action="store_true", help="print the engine's status as JSON")


def run(args: argparse.Namespace) -> int:
    """Carry out the action; an engine that cannot start is a one-line error (exit 2)."""
    from chaos.launch.drivers.engine import EngineUnavailable, PrivateEngine, ensure_image

    engine = PrivateEngine(args.root)
    if args.action == "start":
        try:
            engine.start()
            ensure_image(engine.client())
        except EngineUnavailable as exc:
            raise ConfigError(f"cannot start a Docker engine: {exc}") from None
        info = engine.status()
    elif args.action == "stop":
        info = engine.stop()
    else:
        info = engine.status()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    elif args.action == "status":
        state = f"running (pid {info['pid']}, dockerd {info.get('version')})" if info["running"] else "not running"
        print(f"engine at {info['socket']}: {state}")
        if info["running"]:
            print(f"  containers: {info['containers']}, networks: {info['networks']} (made by chaos)")
    elif args.action == "start":
        print(f"engine running: pid {info['pid']}, socket {info['socket']} (chaos run --driver docker uses it)")
    else:
        removed = info.get("removed", {})
        print(f"engine at {info['root']} stopped (pid {info.get('stopped_pid')}); removed "
              f"{len(removed.get('containers', []))} containers, {len(removed.get('networks', []))} networks")
    return 0
