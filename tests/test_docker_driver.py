"""The docker driver's logic without an engine: fakes stand in for the Docker SDK here.

What a real engine does (containers, pause, disconnect, cleanup) is proven in
``suites/test_docker.py``; these tests pin the mapping from faults to SDK calls, the
records they leave, exit-code translation, engine discovery and bad input.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from multiprocessing.connection import wait
from types import SimpleNamespace

import pytest

from chaos.cli.main import build_scenarios, main, make_parser
from chaos.errors import ConfigError
from chaos.launch import cluster
from chaos.launch.drivers import ProcessDriver, open_driver
from chaos.launch.drivers import docker as dd
from chaos.launch.drivers import engine as eng
from chaos.nemesis.environment import Environment
from chaos.plan.scenario import Scenario, parse_fault
from chaos.target.workload.config import WorkloadConfig


class FakeContainer:
    def __init__(self, name: str, pid: int = 0, status_code: int = 0) -> None:
        self.name, self.calls, self.status = name, [], "running"
        self.attrs = {"State": {"Pid": pid}}
        self._code = status_code

    def reload(self) -> None:
        pass

    def kill(self, signal: str = "SIGKILL") -> None:
        self.calls.append(("kill", signal))

    def pause(self) -> None:
        self.calls.append(("pause",))
        self.status = "paused"

    def restart(self, timeout: int = 10) -> None:
        self.calls.append(("restart", timeout))

    def unpause(self) -> None:
        self.calls.append(("unpause",))

    def wait(self, timeout: float | None = None) -> dict:
        return {"StatusCode": self._code}

    def remove(self, **kw) -> None:
        self.calls.append(("remove", kw))


class FakeConn:
    def __init__(self) -> None:
        self.sent = []

    def send(self, msg) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        pass


def test_signal_exit_codes_read_like_multiprocessing():
    assert eng.exit_code(137) == -signal.SIGKILL
    assert eng.exit_code(143) == -signal.SIGTERM
    assert eng.exit_code(0) == 0 and eng.exit_code(3) == 3 and eng.exit_code(1) == 1


def test_host_mounts_cover_python_venv_and_project_without_duplicates():
    mounts = eng.host_mounts()
    assert "/usr" in mounts and "/etc" in mounts
    import chaos

    for needed in (sys.prefix, os.path.dirname(os.path.dirname(chaos.__file__)), sys.base_prefix):
        real = os.path.realpath(needed)
        assert any(real == m or real.startswith(m.rstrip("/") + "/") for m in mounts), needed
    assert len(mounts) == len(set(mounts))
    assert "/sbin" not in mounts, "docker-init is mounted at /sbin/docker-init; a /sbin bind would hide it"


def test_container_proc_sentinel_fires_when_the_init_process_exits():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = dd.ContainerProc(FakeContainer("c", pid=sleeper.pid, status_code=137), 0)
        assert proc.pid == sleeper.pid and proc.is_alive()
        assert wait([proc.sentinel], timeout=0.1) == []
        sleeper.kill()
        sleeper.wait()
        assert wait([proc.sentinel], timeout=5) == [proc.sentinel]
        assert not proc.is_alive()
        proc.join()
        assert proc.exitcode == -9
        proc.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_container_proc_already_exited_is_readable_at_once():
    proc = dd.ContainerProc(FakeContainer("c", pid=0, status_code=3), 1)
    assert wait([proc.sentinel], timeout=1) == [proc.sentinel]
    proc.join()
    assert proc.exitcode == 3
    proc.close()


def _attempt(tmp_path, faults: list[str]) -> tuple[dd.DockerAttempt, dict[int, FakeContainer], SimpleNamespace]:
    plan = cluster.LaunchPlan(world_size=2, workload=WorkloadConfig().to_dict(), log_dir=str(tmp_path / "logs"),
                              faults=[parse_fault(f) for f in faults])
    network = SimpleNamespace(name="chaos-net", calls=[])
    network.disconnect = lambda c, force=False: network.calls.append(("disconnect", c.name, force))
    network.connect = lambda c: network.calls.append(("connect", c.name))
    owner = SimpleNamespace(network=network, token="t0k3n", ctl_dir=tmp_path, procs=[])
    env = Environment([], 2, None, str(tmp_path / "logs"), 0)
    attempt = dd.DockerAttempt(plan, 0, env, owner)  # type: ignore[arg-type]
    containers = {}
    for rank in range(2):
        containers[rank] = FakeContainer(f"chaos-t0k3n-a0-r{rank}", pid=0)
        attempt.procs[rank] = SimpleNamespace(container=containers[rank], name=containers[rank].name,
                                              pid=1000 + rank, is_alive=lambda: True, close=lambda: None)
        attempt.conns[rank] = FakeConn()
    return attempt, containers, network


def test_kill_term_and_pause_go_through_the_sdk_and_are_recorded(tmp_path):
    attempt, containers, _ = _attempt(tmp_path, ["kill:rank=1,step=3", "term:rank=0,step=4,grace=2",
                                                 "stop:rank=1,phase=write_shards,step=5"])
    attempt._fire(1, 0)
    attempt._fire(0, 1)
    attempt._fire(1, 2)
    assert containers[1].calls == [("kill", "SIGKILL"), ("pause",)]
    assert containers[0].calls == [("kill", "SIGTERM")]
    assert [r for _, r in attempt.pending_kills] == [0], "SIGKILL follows SIGTERM after the grace"
    assert attempt.conns[0].sent == [("go",)], "a terminated rank may handle SIGTERM and go on"
    assert attempt.conns[1].sent == [], "a killed or frozen rank is never released"
    fired = attempt.fired
    assert [(f.kind, f.rank, f.signal, f.detail["sdk"]) for f in fired] == [
        ("kill", 1, "SIGKILL", "container.kill('SIGKILL')"),
        ("term", 0, "SIGTERM", "container.kill('SIGTERM')"),
        ("stop", 1, "SIGSTOP", "container.pause()"),
    ]
    assert all(f.detail["driver"] == "docker" and f.detail["container"].startswith("chaos-t0k3n") for f in fired)
    assert fired[2].spec == "rank1:step5:stop,phase=write_shards"


def test_netdrop_disconnects_the_container_and_lets_the_rank_go_on(tmp_path):
    attempt, containers, network = _attempt(tmp_path, ["netdrop:rank=1,phase=write_shards,step=5"])
    attempt._fire(1, 0)
    assert network.calls == [("disconnect", containers[1].name, True)]
    assert attempt.conns[1].sent == [("go",)]
    assert attempt.disconnected == {1}
    assert attempt.fired[0].detail["network"] == "chaos-net"


def test_restart_goes_through_the_engine_and_watches_the_new_process(tmp_path):
    attempt, containers, _ = _attempt(tmp_path, ["restart:rank=1,phase=write_shards,step=5,timeout=2"])
    old = attempt.procs[1]
    attempt._fire(1, 0)
    assert containers[1].calls == [("restart", 2)]
    assert attempt.procs[1] is not old and isinstance(attempt.procs[1], dd.ContainerProc)
    (fired,) = attempt.fired
    assert (fired.kind, fired.signal, fired.detail["sdk"]) == ("restart", "SIGTERM", "container.restart(timeout=2)")
    assert attempt.conns[1].sent == [], "the restarted rank is a stranger to this attempt"
    attempt.procs[1].close()


def test_corruption_kills_every_container(tmp_path):
    attempt, containers, _ = _attempt(tmp_path, ["bitflip:step=4,bits=8"])
    attempt._fire(0, 0)
    assert all(c.calls == [("kill", "SIGKILL")] for c in containers.values())
    assert attempt.pending_rest == [attempt.plan.faults[0]]


def test_netdrop_needs_no_network_namespaces_under_docker():
    faults = [parse_fault("netdrop:rank=1,step=3"), parse_fault("kill:rank=0,step=5")]
    assert [f.kind for f in dd.DockerCluster.env_faults(faults)] == ["kill"]
    assert ProcessDriver.env_faults(faults) == faults


def test_driver_is_part_of_the_scenario_and_its_replay_command():
    s = Scenario("reference", faults=[parse_fault("kill:rank=1,step=23")], driver="docker")
    s.validate()
    assert s.id.endswith("-docker")
    replay = s.replay_command()
    assert "--driver docker" in replay
    again = build_scenarios(make_parser().parse_args(shlex.split(replay)[1:]))[0]
    assert (again.driver, again.image, again.id) == ("docker", None, s.id)
    assert Scenario.from_dict(s.to_dict()).driver == "docker"
    assert Scenario.from_dict({**s.to_dict(), "driver": None} | {"driver": "process"}).driver == "process"


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"driver": "podman"}, "unknown --driver 'podman'"),
    ({"image": "busybox"}, "--image 'busybox' needs --driver docker"),
    ({"faults": [parse_fault("restart:rank=1,step=3")]}, "a container restart needs --driver docker"),
])
def test_bad_driver_settings_are_one_line_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        Scenario("reference", **kwargs).validate()


def test_cli_rejects_an_unknown_driver_in_one_line(capsys):
    assert main(["run", "--driver", "podman", "--fault", "kill:rank=1,step=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown --driver 'podman'" in err[0]


def test_open_driver():
    assert isinstance(open_driver("process", "/tmp"), ProcessDriver)
    assert isinstance(open_driver("docker", "/tmp"), dd.DockerCluster)
    with pytest.raises(ConfigError, match="unknown driver 'lxc'"):
        open_driver("lxc", "/tmp")


def test_no_engine_reachable_is_unsupported_with_the_way_out(tmp_path, monkeypatch):
    pytest.importorskip("docker")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("CHAOS_ENGINE_ROOT", str(tmp_path / "none"))
    monkeypatch.setattr(eng, "SYSTEM_SOCKET", str(tmp_path / "docker.sock"))
    with pytest.raises(eng.EngineUnavailable, match="chaos engine start"):
        eng.connect()
    from faults import Unsupported

    assert issubclass(eng.EngineUnavailable, Unsupported), "the runner turns it into a skipped verdict"


def test_private_engine_refuses_to_start_without_root_or_dockerd(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, why = eng.can_start_engine()
    assert not ok and ("root" in why or "SDK" in why)
    with pytest.raises(eng.EngineUnavailable):
        eng.PrivateEngine(tmp_path / "e").start()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(eng.shutil, "which", lambda name: None)
    if eng.can_start_engine()[1] != "the docker SDK is not installed (pip install docker)":
        assert eng.can_start_engine() == (False, "no dockerd binary (apt-get install docker.io)")


def test_remove_labelled_unpauses_and_removes_only_by_label():
    paused = FakeContainer("a")
    paused.status = "paused"
    seen = {}

    class Coll:
        def __init__(self, items, key):
            self.items, self.key = items, key

        def list(self, all=False, filters=None):
            seen[self.key] = filters
            return self.items

    net = SimpleNamespace(name="n", remove=lambda: None)
    client = SimpleNamespace(containers=Coll([paused], "c"), networks=Coll([net], "n"), volumes=Coll([], "v"))
    removed = eng.remove_labelled(client, value="tok")
    assert removed == {"containers": ["a"], "networks": ["n"], "volumes": []}
    assert paused.calls[0] == ("unpause",) and paused.calls[1][0] == "remove"
    assert seen == {k: {"label": f"{eng.LABEL}=tok"} for k in ("c", "n", "v")}


def test_empty_image_is_an_empty_tar():
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(eng.empty_tar())) as tar:
        assert tar.getmembers() == []


def test_engine_status_command_without_an_engine(tmp_path, capsys):
    assert main(["engine", "status", "--root", str(tmp_path / "e")]) == 0
    assert "not running" in capsys.readouterr().out
