"""Ways to run a job's ranks: forked processes (``process``, the default) or Docker containers (``docker``).

Each is a :class:`chaos.launch.protocol.Driver`, whose docstring says who calls what, in
which order; :func:`open_driver` makes the one a scenario names.

    engine   a reachable Docker engine, or a private dockerd (chaos engine start)
    docker   ranks as containers; kill / term / pause / disconnect through the SDK
    rank     the entry point a rank container runs
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.launch.protocol import Driver

if TYPE_CHECKING:
    from chaos.launch.cluster import AttemptResult, ClusterResult, LaunchPlan
    from chaos.model.fault import Fault
    from chaos.nemesis.environment import Environment

DRIVERS = ("process", "docker")


class ProcessDriver:
    """The default: ranks forked from the warm fork server (``chaos.launch.cluster``)."""

    name = "process"

    def __enter__(self) -> ProcessDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @staticmethod
    def env_faults(faults: list[Fault]) -> list[Fault]:
        return list(faults)

    def run(self, plan: LaunchPlan, env: Environment) -> ClusterResult:
        from chaos.launch import cluster

        return cluster.run(plan, env)

    def verify(self, plan: LaunchPlan, env: Environment) -> AttemptResult:
        from chaos.launch import cluster

        return cluster.verify(plan, env)

    def hygiene(self, found: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return found


def open_driver(name: str, scratch: str | Path, image: str | None = None) -> Driver:
    """The driver called ``name`` for a scenario whose scratch root is ``scratch``."""
    if name == "process":
        return ProcessDriver()
    if name == "docker":
        from chaos.launch.drivers.docker import DockerCluster

        return DockerCluster(scratch, image)
    from chaos.errors import ConfigError

    raise ConfigError(f"unknown driver {name!r}: known drivers are {', '.join(DRIVERS)}")
