"""Every launcher satisfies its protocol (chaos.launch.protocol): the members it names, with the same parameters."""

from __future__ import annotations

import inspect
import typing

import pytest

from chaos.launch import cluster, job, protocol
from chaos.launch.drivers import ProcessDriver, open_driver
from chaos.launch.drivers.docker import DockerAttempt, DockerCluster
from chaos.nemesis import nodes


def _params(fn: typing.Any) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _members(proto: type) -> list[str]:
    """What a protocol names: its attributes, then the methods written in it (not those Protocol adds)."""
    mine = f"{proto.__name__}."
    return [*proto.__annotations__,
            *(m for m, v in vars(proto).items() if inspect.isfunction(v) and v.__qualname__.startswith(mine))]


@pytest.mark.parametrize("driver", [ProcessDriver(), DockerCluster("scratch")], ids=["process", "docker"])
def test_each_driver_is_a_driver_member_by_member(driver: typing.Any) -> None:
    assert isinstance(driver, protocol.Driver)
    members = _members(protocol.Driver)
    assert members == ["name", "__enter__", "__exit__", "env_faults", "run", "verify", "hygiene"]
    for name in members[1:]:
        assert _params(getattr(type(driver), name)) == _params(getattr(protocol.Driver, name)), name
    assert driver.name in ("process", "docker")


def test_open_driver_returns_the_protocol() -> None:
    assert typing.get_type_hints(open_driver)["return"] is protocol.Driver
    assert isinstance(open_driver("process", "scratch"), protocol.Driver)


@pytest.mark.parametrize("launcher", [job.run_attempt, nodes.run_attempt], ids=["job", "nodes"])
def test_each_attempt_launcher_takes_the_protocols_parameters(launcher: typing.Any) -> None:
    assert _params(launcher) == _params(protocol.AttemptLauncher.__call__)


def test_the_docker_attempt_subclasses_the_public_attempt() -> None:
    assert DockerAttempt.__mro__[1] is cluster.Attempt and not cluster.Attempt.__name__.startswith("_")
