"""Entry point of a rank inside a container: ``python -m chaos.launch.drivers.rank SPEC.json CTL.sock``.

The container cannot inherit a pipe from the supervisor, so the rank connects to the
supervisor's Unix socket in the bind-mounted scratch root, introduces itself with
``("hello", rank)`` once torch is imported, waits to be released (``("go",)``) and then speaks exactly what a forked rank speaks over its pipe
(``chaos.target.workload.train.rank_entry`` never knows the difference).
"""

from __future__ import annotations

import json
import socket
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from chaos.target.workload.spec import RankSpec


def connect(path: str) -> Connection:
    """A multiprocessing connection over the supervisor's Unix socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return Connection(sock.detach())


def main(argv: list[str] | None = None) -> None:
    spec_path, ctl = (argv if argv is not None else sys.argv[1:])[:2]
    spec = RankSpec(**json.loads(Path(spec_path).read_text()))
    # The slow part before the hello: importing torch and the workload, and the seconds-long
    # first call of use_deterministic_algorithms (what the process driver's fork server
    # preloads). Paid after the release, it could outlast a short rendezvous timeout.
    import chaos.target.workload.preload  # noqa: F401
    from chaos.target.workload.train import rank_entry

    conn = connect(ctl)
    conn.send(("hello", spec.rank))
    if conn.recv()[0] != "go":  # released by the supervisor: rank 0 first, the rest once its store listens
        raise SystemExit(1)
    rank_entry(spec, conn)


if __name__ == "__main__":
    main()
