"""``chaos run --nodes N``: the pure parts of a job spread over simulated nodes (chaos/nemesis/nodes.py).

Placeholders and the variables each node's agent gets, node points (parsing,
enumeration from the fault-free traces, their results entry), the spec's ConfigErrors,
the judge's no-effect rule for a link cut, and the Chaos Mesh resources parsed back.
The real two-node job is in suites/test_multinode.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chaos.cli import job as cli_job
from chaos.errors import ConfigError
from chaos.launch.job import AttemptOutcome
from chaos.model.jobspec import JobSpec, Point, parse_point
from chaos.nemesis import nodes
from chaos.nemesis.atrest import Applied
from chaos.plan import pointset
from chaos.record.jobhistory import PointRecord

TORCHRUN = ("torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "{rdzv}", "--max-restarts", "2", "train.py", "--out", "{out}")


def job(**kw: object) -> JobSpec:
    return JobSpec(command=kw.pop("command", TORCHRUN), nodes=kw.pop("nodes", 2), **kw)  # type: ignore[arg-type]


def step(n: int, ts: float) -> dict[str, object]:
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}, "ts": ts}


# -- placeholders and each node's variables ---------------------------------------------------

def test_each_node_gets_the_rendezvous_its_address_and_is_host() -> None:
    argv = ["torchrun", "--rdzv-endpoint", "{rdzv}", "train.py", "--tag", "n{node}@{addr}"]
    addrs = ["10.1.2.1", "10.1.2.2"]
    a0, env0 = nodes.node_launch(argv, 0, addrs, 29400, "cxn0")
    a1, env1 = nodes.node_launch(argv, 1, addrs, 29400, "cxn1")
    assert a0[2] == a1[2] == "10.1.2.1:29400"
    assert a0[-1] == "n0@10.1.2.1" and a1[-1] == "n1@10.1.2.2"
    assert env0["PET_RDZV_CONF"] == "is_host=1" and env1["PET_RDZV_CONF"] == "is_host=0"
    assert env0["PET_LOCAL_ADDR"] == "10.1.2.1" and env1["PET_LOCAL_ADDR"] == "10.1.2.2"
    assert env1["GLOO_SOCKET_IFNAME"] == "cxn1"
    assert argv[2] == "{rdzv}", "the job's own command line is not edited in place"


@pytest.mark.parametrize(("conf", "node", "want"), [
    (["--rdzv-conf", "read_timeout=20"], 0, ["--rdzv-conf", "read_timeout=20,is_host=1"]),
    (["--rdzv_conf=read_timeout=20"], 1, ["--rdzv_conf=read_timeout=20,is_host=0"]),
    (["--rdzv-conf", "is_host=0"], 0, ["--rdzv-conf", "is_host=0"]),  # the user's own choice stands
])
def test_a_rdzv_conf_of_the_command_gets_is_host_appended(conf: list[str], node: int, want: list[str]) -> None:
    argv, env = nodes.node_launch(["torchrun", *conf, "x.py"], node, ["10.0.0.1", "10.0.0.2"], 1, "eth0")
    assert argv[1:-1] == want
    assert "PET_RDZV_CONF" not in env


def test_a_local_addr_of_the_command_wins() -> None:
    _argv, env = nodes.node_launch(["torchrun", "--local-addr", "{addr}", "x.py"], 1, ["a", "b"], 1, "eth0")
    assert "PET_LOCAL_ADDR" not in env and _argv[2] == "b"


# -- points -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["node1:step3:loss", "node0:step7:rdzv", "node1:step2:link", "node0:step2:link"])
def test_node_points_round_trip_through_their_id(text: str) -> None:
    p = parse_point(text)
    assert p.id == text and p.family == "node" and p.node == int(text[4]) and p.rank == -1
    placed = nodes.for_job(job(), p)
    assert placed.rank == 2 * p.node and placed.id == text  # node i's first local rank announces the step
    assert placed.env() == {"rank": placed.rank, "mode": "net", "op": None, "step": p.step}


@pytest.mark.parametrize(("text", "says"), [
    ("node0:step3:loss", "node0:step3:rdzv"), ("node1:step3:rdzv", "rendezvous host is node 0"),
    ("node1:stepx:loss", "malformed"), ("node1:step3:kill", "malformed"),
])
def test_bad_node_points_are_config_errors(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_point(text)


def test_a_point_of_a_node_the_job_does_not_have_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="nodes 0..1"):
        nodes.for_job(job(), parse_point("node2:step3:link"))
    assert cli_job.main(["--point", "node1:step3:loss", "--", *TORCHRUN]) == 2
    assert "a node point needs --nodes N" in capsys.readouterr().err


def test_points_come_from_each_nodes_first_rank_in_the_fault_free_run() -> None:
    traces = {(0, 0): [step(1, 1.0), step(2, 2.0)], (1, 0): [step(1, 1.0), step(2, 2.0), step(3, 3.0)],
              (2, 0): [step(1, 1.0), step(2, 2.0), step(3, 3.0)], (2, 1): [step(9, 9.0)]}
    ids = [p.id for p in nodes.points(job(), traces)]
    assert ids == ["node0:step1:rdzv", "node0:step2:rdzv", "node1:step1:loss", "node1:step2:loss",
                   "node1:step3:loss", "node0:step1:link", "node0:step2:link", "node1:step1:link",
                   "node1:step2:link", "node1:step3:link"]
    every = pointset.enumerate_points(job(), traces, None, ("kill", "node"))
    assert [p.id for p in every if p.family == "node"] == ids and any(p.family == "kill" for p in every)
    assert nodes.points(JobSpec(command=("python", "t.py", "{out}")), traces) == []


def test_with_nodes_the_default_kinds_are_kill_errno_and_node() -> None:
    kinds, notes = pointset.kinds_to_explore(job())
    assert kinds == ("kill", "errno", "node") and "not explored" in notes[0]
    assert "node" not in pointset.kinds_to_explore(JobSpec(command=("python", "t.py", "{out}")))[0]
    assert pointset.kinds_to_explore(job(faults=("node",)))[0] == ("node",)


def test_a_node_point_in_the_results_names_its_node_and_announcing_rank() -> None:
    p = nodes.for_job(job(), parse_point("node1:step3:link"))
    assert p.to_fault(hold_s=3.0) == {"kind": "node_link_cut", "rank": None, "step": 3, "attempt": 0,
                                      "params": {"node": 1, "announced_by_rank": 2, "hold_s": 3.0},
                                      "spec": "node1:step3:link"}
    assert nodes.for_job(job(), parse_point("node0:step3:rdzv")).to_fault()["kind"] == "rendezvous_host_loss"


# -- the spec ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "says"), [
    ({"command": ("python", "train.py", "--out", "{out}")}, "needs a torchrun COMMAND"),
    ({"command": tuple(a if a != "{rdzv}" else "10.0.0.1:1" for a in TORCHRUN)}, "has no {rdzv}"),
    ({"command": tuple(a if a != "c10d" else "static" for a in TORCHRUN)}, "needs --rdzv-backend c10d"),
    ({"command": (*TORCHRUN[:1], "--standalone", *TORCHRUN[1:])}, "--standalone"),
    ({"command": tuple(a for a in TORCHRUN if a not in ("--nnodes",)) }, "needs --nnodes"),
    ({"nodes": 3}, "does not fit COMMAND's --nnodes 2"),
    ({"nodes": 1}, "--nodes must be in 2..8"),
    ({"nodes": 9}, "--nodes must be in 2..8"),
    ({"command": tuple("auto" if a == "2" and i == 4 else a for i, a in enumerate(TORCHRUN))}, "--nproc-per-node"),
    ({"faults": ("term",)}, "only kill,errno,node"),
    ({"node_hold_s": 0.0}, "--node-hold must be a positive"),
    ({"resume_command": ("python", "train.py", "{out}")}, "needs a torchrun --resume-cmd"),
])
def test_a_spec_that_cannot_run_on_nodes_is_a_config_error(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("{", r"\{").replace("}", r"\}").replace("(", r"\(")):
        job(**kw)


def test_node_faults_without_nodes_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--faults node needs --nodes N"):
        JobSpec(command=TORCHRUN, faults=("node",))


def test_an_elastic_nnodes_range_holds_the_nodes_and_the_spec_round_trips() -> None:
    spec = job(command=tuple("1:3" if a == "2" and i == 2 else a for i, a in enumerate(TORCHRUN)), node_hold_s=2.5)
    assert spec.world_size == 4
    assert spec.replay_args()[-4:] == ["--nodes", "2", "--node-hold", "2.5"]
    back = JobSpec.from_dict(spec.to_dict())
    assert back == spec
    assert "--nodes 2" in spec.replay_command(parse_point("node1:step3:loss"))


def test_the_cli_builds_a_nodes_spec_and_refuses_chaos_mesh_without_nodes(tmp_path: Path) -> None:
    args, spec = cli_job.build(["--nodes", "2", "--node-hold", "3", "--chaos-mesh", str(tmp_path), "--", *TORCHRUN])
    assert spec.nodes == 2 and spec.node_hold_s == 3.0 and args.chaos_mesh == str(tmp_path)
    with pytest.raises(ConfigError, match="--chaos-mesh writes node faults: it needs --nodes N"):
        cli_job.build(["--chaos-mesh", str(tmp_path), "--", *TORCHRUN])


def test_the_cli_says_why_a_plain_command_cannot_run_on_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_job.main(["--nodes", "2", "--", "python", "train.py", "--out", "{out}"]) == 2
    assert "needs a torchrun COMMAND" in capsys.readouterr().err


# -- the judge's evidence -----------------------------------------------------------------------

def _link_record(traces: dict[tuple[int, int], list[dict[str, object]]], ok: bool = True) -> PointRecord:
    point = nodes.for_job(job(), parse_point("node1:step2:link"))
    record = {"node": 1, "mode": "link", "step": 2, "hold_s": 3.0, "down": {"mono": 10.0}, "up": {"mono": 13.0}}
    record["stall"] = nodes.stall(record, traces)  # type: ignore[arg-type]
    first = AttemptOutcome(0, ["torchrun"], returncodes=[0, 0] if ok else [0, 1])
    return PointRecord(point, "/nowhere", [first], traces, None, Applied(nodes.describe(record), record))


def test_a_link_cut_that_stalled_the_ranks_is_judged_and_one_that_did_not_is_no_effect() -> None:
    stalled = {(0, 0): [step(2, 9.0), step(3, 14.0)], (2, 0): [step(2, 9.5), step(3, 14.0)]}
    rec = _link_record(stalled)
    assert rec.applied.record["stall"]["stalled"] == [0, 2]
    assert nodes.no_effect(rec) is None
    assert "rank(s) 0, 2 announced no step while it was down" in rec.applied.what
    kept_going = {(0, 0): [step(2, 9.0), step(3, 11.0)], (2, 0): [step(2, 9.5), step(3, 12.0)]}
    assert "did nothing to judge" in (nodes.no_effect(_link_record(kept_going)) or "")
    assert nodes.no_effect(_link_record(kept_going, ok=False)) is None  # the job failed: the cut did something


def test_the_fault_line_of_a_loss_says_what_was_killed_and_how_each_agent_ended() -> None:
    record = {"node": 0, "mode": "rdzv", "step": 3, "killed": {"pids": [10, 11, 12]},
              "agents": [{"node": 0, "replacement": True, "ended": "stopped", "returncode": -9},
                         {"node": 1, "replacement": False, "ended": "exited", "returncode": 1,
                          "cause": "RendezvousConnectionError: gone"}]}
    assert nodes.describe(record) == (
        "node 0, the rendezvous host, lost at its step 3 (its agent and 2 other process(es) SIGKILLed; a replacement "
        "agent started on the node): node 0's replacement agent was stopped when another agent had failed, node 1's "
        "agent exited 1 (RendezvousConnectionError: gone)")


# -- Chaos Mesh ---------------------------------------------------------------------------------

def test_the_node_points_become_chaos_mesh_resources_that_parse_back(tmp_path: Path) -> None:
    spec = job(node_hold_s=4.0)
    chosen = [nodes.for_job(spec, parse_point(t)) for t in ("node1:step3:loss", "node0:step3:rdzv", "node1:step5:link")]
    chosen.append(Point(0, "kill", step=3))  # not a node point: left out
    paths = nodes.write_chaos_mesh(str(tmp_path / "mesh"), spec, chosen, namespace="train", job_name="ddp")
    docs = [yaml.safe_load(Path(p).read_text()) for p in paths]
    assert [d["kind"] for d in docs] == ["PodChaos", "PodChaos", "NetworkChaos"]
    kill, host, cut = docs
    assert kill["apiVersion"] == "chaos-mesh.org/v1alpha1" and kill["metadata"]["name"] == "ddp-node1-step3-loss"
    assert kill["spec"]["action"] == "pod-kill" and kill["spec"]["mode"] == "one"
    assert kill["spec"]["selector"] == {"namespaces": ["train"], "labelSelectors": {
        "training.kubeflow.org/job-name": "ddp", "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "1"}}
    assert host["spec"]["selector"]["labelSelectors"]["training.kubeflow.org/replica-index"] == "0"
    assert kill["metadata"]["annotations"]["chaos.harness/at-step"] == "3"
    assert "--point node1:step3:loss" in kill["metadata"]["annotations"]["chaos.harness/replay"]
    assert cut["spec"]["action"] == "partition" and cut["spec"]["duration"] == "4s"
    assert cut["spec"]["direction"] == "both" and cut["spec"]["target"]["mode"] == "all"
    assert cut["spec"]["target"]["selector"]["expressionSelectors"] == [
        {"key": "training.kubeflow.org/replica-index", "operator": "NotIn", "values": ["1"]}]


def test_chaos_mesh_into_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        nodes.write_chaos_mesh(str(tmp_path / "f"), job(), [])
