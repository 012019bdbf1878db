"""Ranks as Docker containers on a private engine: killed, frozen or cut off mid-save.

Each scenario runs two rank containers (the host-mounted empty image) on a bridge
network made for it, fires the fault through the Docker SDK while rank 1 is inside the
reference checkpointer's ``write_shards`` phase, restarts the job in fresh containers
and judges it with the same oracles as the process driver. Afterwards nothing of it may
remain on the engine: no container, no network, no container process. The session's
private engine (the ``docker_engine`` fixture) is started once and stopped at the end;
``test_engine_stop_leaves_nothing`` proves a stopped engine leaves no process or file.

Default run: the quick cleanup checks; the container faults (netdrop, pause, kill, restart,
SIGTERM) and the replay are ``slow`` (20-50 s each), run by the nightly.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
import time

import pytest

from chaos.plan.scenario import parse_fault

pytestmark = [pytest.mark.chaos, pytest.mark.docker]

# The network suite's workload (so a session computes its golden run once): saves at
# 4, 8, ..., 24; the fault lands inside the save at step 20. A cut or frozen peer fails
# the other rank's collective within 5 s.
DOCKER_WORKLOAD = {"steps": 24, "save_every": 4, "collective_timeout_s": 5.0}


def _ours(engine, label_value: str | None = None) -> dict[str, list[str]]:
    from chaos.launch.drivers.engine import LABEL

    flt = {"label": f"{LABEL}={label_value}" if label_value else LABEL}
    client = engine.client()
    return {"containers": [c.name for c in client.containers.list(all=True, filters=flt)],
            "networks": [n.name for n in client.networks.list(filters=flt)],
            "volumes": [v.name for v in client.volumes.list(filters=flt)]}


@pytest.fixture
def run_docker(chaos, docker_engine):
    """Run one scenario with the docker driver and the short workload."""

    def run(*faults: str, **workload):
        scenario = chaos.scenario("reference", list(faults), **{**DOCKER_WORKLOAD, **workload})
        result = chaos.run(dataclasses.replace(scenario, driver="docker", id=""))
        if result.verdict == "skipped":
            pytest.skip(result.error or "scenario skipped")
        return result

    return run


@pytest.mark.parametrize(("fault", "sdk"), [
    # The SDK calls are pinned by tests/test_docker_driver.py and the cleanup checks below run per
    # commit; each real run costs 20-50 s (and the netdrop one failed once under load), so the
    # nightly runs them all.
    pytest.param("netdrop:rank=1,phase=write_shards,step=20", "network.disconnect(force=True)", marks=pytest.mark.slow),
    pytest.param("stop:rank=1,phase=write_shards,step=20", "container.pause()", marks=pytest.mark.slow),
    pytest.param("kill:rank=1,phase=write_shards,step=20", "container.kill('SIGKILL')", marks=pytest.mark.slow),
    pytest.param("restart:rank=1,phase=write_shards,step=20", "container.restart(timeout=0)", marks=pytest.mark.slow),
])
def test_container_fault_mid_save_restarts_and_resumes_bit_exact(chaos, run_docker, docker_engine, fault, sdk):
    result = run_docker(fault)
    chaos.check(result)
    record = result.record
    outcomes = [(a["attempt"], a["outcome"], a["detail"], round(a["ended"] - a["started"], 1)) for a in record.attempts]
    assert record.attempts[0]["outcome"] == "rank_failed", f"the fault must end the first attempt: {outcomes}"
    assert record.attempts[-1]["outcome"] == "ok" and len(record.attempts) >= 2
    (fired,) = record.fired_faults()
    assert fired["spec"] == parse_fault(fault).spec() and fired["detail"]["sdk"] == sdk
    assert fired["detail"]["driver"] == "docker" and fired["detail"]["container"].endswith("-a0-r1")
    points = [e for e in record.events[0][1] if e["ev"] == "fault_point"]
    assert points and points[0]["phase"] == "write_shards" and points[0]["step"] == 20
    assert "--driver docker" in result.replay
    assert _ours(docker_engine) == {"containers": [], "networks": [], "volumes": []}
    assert result.oracles["hygiene"].passed and "containers" in result.oracles["hygiene"].evidence


def test_interrupt_removes_containers_and_network(docker_engine, tmp_path):
    """Ctrl-C while a rank container runs: the driver's context removes everything it made."""
    from chaos.launch.drivers.docker import DockerCluster
    from faults.process import alive, marked_under

    scratch = tempfile.mkdtemp(prefix="chaos-int-")
    try:
        with pytest.raises(KeyboardInterrupt), DockerCluster(scratch) as driver:
            container = driver.start_container(f"chaos-{driver.token}-a0-r0", [], command=["sleep", "600"])
            container.reload()
            pid = container.attrs["State"]["Pid"]
            assert pid and alive(pid)
            # marked as a process rank is: a sweep after a SIGKILLed harness finds it from the host
            assert pid in marked_under(str(driver.scratch))
            token = driver.token
            raise KeyboardInterrupt
        assert _ours(docker_engine, token) == {"containers": [], "networks": [], "volumes": []}
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the container's processes must be gone"
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def test_engine_stop_leaves_nothing():
    """A private engine with a running container and a network, stopped: no dockerd, no
    containerd or shim, no container process, no root directory left."""
    from chaos.launch.drivers.engine import LABEL, PrivateEngine, can_start_engine, ensure_image
    from faults.process import alive

    ok, why = can_start_engine()
    if not ok:
        pytest.skip(f"no Docker engine can be started: {why}")
    engine = PrivateEngine(tempfile.mkdtemp(prefix="chaos-eng-"))
    try:
        engine.start()
        client = engine.client()
        ensure_image(client)
        client.networks.create("chaos-stoptest", driver="bridge", labels={LABEL: "stoptest"})
        from chaos.launch.drivers.engine import host_mounts

        c = client.containers.run("chaos-empty:latest", ["sleep", "600"], detach=True, init=True,
                                  network="chaos-stoptest", labels={LABEL: "stoptest"},
                                  volumes={p: {"bind": p, "mode": "ro"} for p in host_mounts()})
        c.reload()
        pids = [engine.pid(), c.attrs["State"]["Pid"]]
        assert all(pids) and all(alive(p) for p in pids)
        for pid in engine._processes():  # their temp files (containerd's stacks dump) go with the root
            env = dict(e.split(b"=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
            assert env.get(b"TMPDIR", b"").startswith(os.fsencode(str(engine.root)) + b"/"), (pid, env.get(b"TMPDIR"))
    finally:
        done = engine.stop()
    assert done["removed"]["containers"] and done["removed"]["networks"] == ["chaos-stoptest"]
    assert not any(alive(p) for p in pids)
    assert engine._processes() == []
    assert not engine.root.exists()


@pytest.mark.slow
def test_term_with_grace_in_a_container(chaos, run_docker):
    chaos.check(run_docker("term:rank=0,step=14,grace=2"))


@pytest.mark.slow
def test_replay_command_reruns_the_docker_scenario(run_docker, docker_engine, tmp_path):
    """The printed replay command, run as is, runs the same scenario in containers and passes."""
    import subprocess
    import sys

    result = run_docker("kill:rank=1,phase=write_shards,step=20")
    args = shlex.split(result.replay)[1:] + ["--json", str(tmp_path / "r.json")]
    env = {**os.environ, "DOCKER_HOST": docker_engine.url}
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    (entry,) = json.loads((tmp_path / "r.json").read_text())["scenarios"]
    assert entry["scenario"]["driver"] == "docker" and entry["fired"][0]["detail"]["driver"] == "docker"
