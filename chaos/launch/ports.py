"""A free TCP port on the loopback interface, for rank rendezvous and local servers; and the
longest path a Unix socket can bind (:data:`UNIX_PATH_MAX`), for the launchers that make one
(``cluster``'s fork server, the docker driver's control socket, ``slurmcluster``'s munge).

Who calls it: ``cluster`` (a scenario's rank group), ``job.launch`` and ``job.nodes`` (an
attempt's rendezvous), ``recovery_pool`` and ``powerloss`` (the recovery workers' group),
``bench_ranks`` (a bench's rank group), ``storage.local_s3`` (the embedded moto server)
and the tests. A module of its own so that a bench rank or a storage backend does not
import the launcher (``chaos.launch.cluster`` costs ~40 ms to import) to get one.
"""

from __future__ import annotations

import socket

UNIX_PATH_MAX = 107  # bytes: sockaddr_un.sun_path holds 108, its NUL included


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago: bound, read and released again.

    Another process may take it before the caller binds it; callers that cannot retry
    hand the bound socket over instead (the launcher's supervisor does).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
