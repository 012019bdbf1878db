"""A network of the engine for one run chain of a job's containers: its ranks' links to cut.

Why: a job whose copies run as containers (``--launcher docker``) is on the host's network,
whose links the harness does not cut, so ``--faults net`` was refused there. A network cut
is a container's everyday failure (a node's link, a CNI plugin's), and the built-in
workload's docker driver has cut containers off their network from the start. This gives
a job's containers the same: each run chain that explores network cuts (a ``net`` point's,
the second fault-free run) gets a bridge network of its own on the engine, every copy of
each attempt joins it under its rank's alias (``rank0``, ``rank1`` ...; ``MASTER_ADDR`` is
``rank0``, gloo binds ``eth0``), and a cut disconnects the rank's container from it
(``network disconnect --force``): every packet to or from it is gone, as with a pulled
cable, while the process runs on.

It is what a :class:`faults.network.NetworkLab` is to processes, with the calls
``chaos.nemesis.netcut`` and ``chaos.launch.job`` make of one: ``setup``/``teardown``
(``netcut.lab_for``), ``rank_env`` and :meth:`run_options` (``job._plan``, through
``containers.wrap``), ``link_down``/``link_up`` (``netcut.cut``/``restore``), and ``mark``,
set by ``job.run_attempt`` to the attempt whose containers are on it now. The network is
internal (no route off the engine's host) and labelled; ``teardown`` removes it at the end
of its chain, ``netcut.teardown_all`` after an interrupt, and :func:`sweep` whatever this
process left (``containers.sweep``, ``job.kill_all``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from chaos.errors import ConfigError
from chaos.launch import containers
from chaos.launch.drivers import engine
from faults import FaultError

LABEL_NETWORK = "chaos.job.network"  # a run chain's network: its suffix
_made: set[str] = set()  # networks this process made and has not removed (sweep)


def _api() -> Any:
    """The engine's low-level client; FaultError where it no longer answers (it went away under the run)."""
    try:
        return containers.engine_client().api
    except ConfigError as exc:
        raise FaultError(str(exc)) from None


def alias(rank: int) -> str:
    """A rank's name on the network: every attempt's copy of that rank answers to it."""
    return f"rank{rank}"


class ContainerNetwork:
    """One run chain's bridge network on the engine (see the module docstring)."""

    def __init__(self, n_ranks: int) -> None:
        self.n_ranks = n_ranks
        self.suffix = secrets.token_hex(4)
        self.bridge = f"chaos-jobnet-{self.suffix}"  # the network's name (a NetworkLab's bridge)
        self.mark: str | None = None  # the attempt whose containers are on it (job.run_attempt)

    def setup(self) -> None:
        """Make the network; FaultError if the engine refuses."""
        import docker

        try:
            _api().create_network(self.bridge, driver="bridge", internal=True,
                                       labels={engine.LABEL: "job", LABEL_NETWORK: self.suffix})
        except docker.errors.DockerException as exc:
            raise FaultError(f"the engine could not make network {self.bridge}: {exc}") from None
        _made.add(self.bridge)

    def teardown(self) -> None:
        """Remove the network (its containers are gone with their attempts; any left is disconnected)."""
        _remove(_api(), self.bridge)

    def ns_name(self, rank: int) -> str:
        return alias(rank)

    def addr(self, rank: int) -> str:
        return alias(rank)

    def rank_env(self, rank: int, port: int) -> dict[str, str]:
        """The rendezvous a copy of rank ``rank`` uses: rank 0's alias, over the network's interface."""
        return {"MASTER_ADDR": alias(0), "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "eth0"}

    def run_options(self, rank: int) -> list[str]:
        """``docker run`` options that put a copy of rank ``rank`` on the network under its alias."""
        return ["--network", self.bridge, "--network-alias", alias(rank)]

    def _container(self, rank: int) -> str:
        if self.mark is None:
            raise FaultError("no attempt's containers are on the network")
        return containers.container_name(self.mark, rank)

    def link_down(self, rank: int, side: str = "host") -> dict[str, Any]:
        """Disconnect rank ``rank``'s container from the network, now."""
        import docker

        name = self._container(rank)
        ts = time.monotonic()
        try:
            _api().disconnect_container_from_network(name, self.bridge, force=True)
        except docker.errors.DockerException as exc:
            raise FaultError(f"container {name} could not be disconnected from {self.bridge}: {exc}") from None
        return {"ts": ts, "container": name, "network": self.bridge, "call": "network disconnect --force"}

    def link_up(self, rank: int, side: str = "host") -> dict[str, Any]:
        """Reconnect it, where it still exists (after an attempt its container is gone with it)."""
        import docker

        name = self._container(rank)
        try:
            _api().connect_container_to_network(name, self.bridge, aliases=[alias(rank)])
        except docker.errors.NotFound:
            return {"ts": time.monotonic(), "container": name, "gone": True}
        except docker.errors.DockerException as exc:
            raise FaultError(f"container {name} could not be reconnected to {self.bridge}: {exc}") from None
        return {"ts": time.monotonic(), "container": name}


def _remove(api: Any, name: str) -> bool:
    """Remove network ``name``, disconnecting what is still on it; whether it was there."""
    import docker

    try:
        for cid in (api.inspect_network(name).get("Containers") or {}):
            try:
                api.disconnect_container_from_network(cid, name, force=True)
            except docker.errors.DockerException:
                pass
        api.remove_network(name)
    except docker.errors.NotFound:
        _made.discard(name)
        return False
    except docker.errors.DockerException as exc:
        raise FaultError(f"network {name} could not be removed: {exc}") from None
    _made.discard(name)
    return True


def sweep() -> list[str]:
    """Remove every network this process made and has not removed (an interrupt); their names."""
    if not _made:
        return []
    import docker

    try:
        api = _api()
    except Exception:  # noqa: BLE001 - no engine now, or none answering: nothing of ours can be on it
        return []
    removed = []
    for name in sorted(_made):
        try:
            if _remove(api, name):
                removed.append(name)
        except (FaultError, docker.errors.DockerException):
            continue
    return removed


__all__ = ["LABEL_NETWORK", "ContainerNetwork", "alias", "sweep"]
