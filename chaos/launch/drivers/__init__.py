"""Ways to run a job's ranks: forked processes (``process``, the default) or Docker containers (``docker``).

A driver is a context manager the runner holds around one scenario's faulted run and
final load; both drivers return the same ``cluster`` result types and leave rank logs
at the same paths, so ``RunRecord`` and the oracles never know which one ran::

    with open_driver(scenario.driver, scratch, image) as driver:
        outcome = driver.run(plan, env)      # ClusterResult
        verify = driver.verify(plan, env)    # AttemptResult
    record.hygiene = driver.hygiene(found)   # driver-specific leftovers folded in

    engine   a reachable Docker engine, or a private dockerd (chaos engine start)
    docker   ranks as containers; kill / term / pause / disconnect through the SDK
    rank     the entry point a rank container runs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DRIVERS = ("process", "docker")


class ProcessDriver:
    """The default: ranks forked from the warm fork server (``chaos.launch.cluster``)."""

    name = "process"

    def __enter__(self) -> ProcessDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @staticmethod
    def env_faults(faults: list[Any]) -> list[Any]:
        return list(faults)

    def run(self, plan: Any, env: Any) -> Any:
        from chaos.launch import cluster

        return cluster.run(plan, env)

    def verify(self, plan: Any, env: Any) -> Any:
        from chaos.launch import cluster

        return cluster.verify(plan, env)

    def hygiene(self, found: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return found


def open_driver(name: str, scratch: str | Path, image: str | None = None) -> Any:
    """The driver called ``name`` for a scenario whose scratch root is ``scratch``."""
    if name == "process":
        return ProcessDriver()
    if name == "docker":
        from chaos.launch.drivers.docker import DockerCluster

        return DockerCluster(scratch, image)
    from chaos.errors import ConfigError

    raise ConfigError(f"unknown driver {name!r}: known drivers are {', '.join(DRIVERS)}")
