"""``node``: a job spread over simulated nodes, and the faults of a node (``chaos run --nodes N -- torchrun ...``).

One real ``torchrun`` agent per node, each in its own network namespace of one
:class:`faults.network.NetworkLab` (node i = lab rank i, its veth on the lab's bridge),
the agents meeting through torchrun's c10d rendezvous on node 0. COMMAND is the
command line of one node's agent, with placeholders the harness fills in per node:

- ``{rdzv}``: the rendezvous endpoint, node 0's lab address and a free port
  (``--rdzv-endpoint {rdzv}``); required;
- ``{node}``: the node's index; ``{addr}``: the node's lab address.

The harness sets what torchrun would otherwise guess wrong inside a namespace, through
torchrun's own ``PET_*`` variables (an option in COMMAND wins): ``PET_LOCAL_ADDR`` =
the node's address (the host name resolves to an address of the host, unreachable
from a namespace; it is also what makes node i's agent group rank i, so node i holds
ranks ``i*P .. i*P+P-1`` for ``--nproc-per-node P``) and ``is_host`` in the rendezvous
config (1 on node 0, which hosts the c10d store; appended to a ``--rdzv-conf`` of
COMMAND), and ``GLOO_SOCKET_IFNAME`` = the node's veth for its workers.

Node faults (the ``node`` family, ``node<i>:step<n>:MODE``), fired when rank ``i*P``
announces step n (it leaves a ``net`` request, ``inproc.py``, and the launcher's poll
loop here answers it):

- ``loss`` (node i != 0): node i's agent and every process it started (its workers
  start sessions of their own: they are found by ``CHAOS_JOB_NODE``) are SIGKILLed, and
  a replacement agent is started on the node at once, as a scheduler would; the
  surviving agents' torchelastic restarts their workers (``TORCHELASTIC_RESTART_COUNT``
  1 in their traces), the replacement's workers join the new round. A replacement's
  workers are traced as attempt ``TORCHRUN_STRIDE * (REPLACEMENT_BASE + attempt)``, so
  they are neither the killed attempt nor a torchelastic restart;
- ``rdzv``: the same for node 0, which hosts the rendezvous store: the other agents lose
  their store with it;
- ``link`` (any node): node i's host-side veth down for ``--node-hold`` seconds, then up;
  the job goes on as it can. A cut during which every rank kept announcing steps did
  nothing to judge (``no_effect``).

When an agent exits non-zero by itself the job has failed (the others wait in a
rendezvous that cannot complete): after ``NODE_SETTLE_S`` every agent is stopped and
``explore._restarts`` relaunches all of them (``--max-restarts``), as a scheduler
restarting a failed job would. Every namespace, veth and bridge goes with the run chain
(``netcut.lab_for`` / ``netcut.teardown_all``), every agent with the attempt
(``chaos.launch.reaper``).

:func:`chaos_mesh_resources` writes the same fault plan for a Kubeflow PyTorchJob on
Kubernetes: a PodChaos ``pod-kill`` per loss, a NetworkChaos ``partition`` per link cut
(``--chaos-mesh DIR``).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.errors import ChaosError, ConfigError
from chaos.launch import job as launch
from chaos.launch import reaper
from chaos.launch.answers import answer
from chaos.launch.output import log_cause
from chaos.launch.ports import free_port
from chaos.launch.silence import Silence
from chaos.model import jobspec as S
from chaos.nemesis import netcut
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces
from faults import FaultError
from faults.process import group_members, marked_with

if TYPE_CHECKING:
    from chaos.record.jobhistory import PointRecord
    from faults.network import NetworkLab

NODE, ADDR = "{node}", "{addr}"
ENV_NODE = "CHAOS_JOB_NODE"  # <mark>/node<i>: every process of node i (its agent, its workers)
REPLACEMENT_BASE = 50        # a replacement agent's CHAOS_JOB_ATTEMPT: REPLACEMENT_BASE + the attempt
NODE_SETTLE_S = 2.0          # after one agent failed, how long the others get to end by themselves


# -- the spec ---------------------------------------------------------------------------------

def kinds_to_explore(job: S.JobSpec) -> tuple[tuple[str, ...], list[str]]:
    """The kinds explored on nodes and a note on those left out (``pointset.kinds_to_explore``)."""
    if job.faults is not None:
        return tuple(k for k in S.FAULT_KINDS if k in job.faults), []
    return S.KINDS_WITH_NODES, ["with --nodes, SIGTERM, corruption, power loss, a full disk and network cuts between "
                              "ranks are not explored (the node launcher answers node requests only)"]


def node_launch(argv: list[str], node: int, addrs: list[str], port: int, ifname: str) -> tuple[list[str], dict[str, str]]:
    """Node ``node``'s command line (placeholders filled in) and the variables it needs.

    ``addrs``: every node's lab address (node 0 hosts the rendezvous on ``port``);
    ``ifname``: the node's veth inside its namespace.
    """
    rdzv = f"{addrs[0]}:{port}"
    out = [a.replace(S.RDZV, rdzv).replace(NODE, str(node)).replace(ADDR, addrs[node]) for a in argv]
    env = {"GLOO_SOCKET_IFNAME": ifname, "TP_SOCKET_IFNAME": ifname}
    if S.torchrun_option(out, "--local-addr", "--local_addr") is None:
        env["PET_LOCAL_ADDR"] = addrs[node]
    is_host = f"is_host={1 if node == 0 else 0}"
    conf = S.torchrun_option(out, "--rdzv-conf", "--rdzv_conf")
    if conf is None:
        env["PET_RDZV_CONF"] = is_host
    elif "is_host" not in conf[1]:
        i, value = conf
        joined = f"{value},{is_host}" if value else is_host
        out[i] = joined if out[i] == value else f"{out[i].split('=', 1)[0]}={joined}"
    return out, env


# -- points ---------------------------------------------------------------------------------

def trigger_rank(job: S.JobSpec, node: int) -> int:
    """The rank whose step announcement fires a point of node ``node``: its first local rank."""
    return node * S.nproc_per_node(job.command)


def for_job(job: S.JobSpec, point: S.Point) -> S.Point:
    """A parsed node point with its announcing rank (the node's first local rank); ConfigError for
    a node the job does not have."""
    if point.node is None:
        return point
    if job.nodes is None or point.node >= job.nodes:
        raise ConfigError(f"--point {point.id}: the job runs on {job.nodes or 'no simulated'} node(s) "
                          f"({'--nodes N' if job.nodes is None else f'nodes 0..{job.nodes - 1}'})")
    if point.rank >= 0:
        return point
    return S.Point(trigger_rank(job, point.node), point.mode, step=point.step, node=point.node)


def points(job: S.JobSpec, traces: Traces, facts: Facts | None = None) -> list[S.Point]:
    """Every node point: each node's loss (node 0: the rendezvous host's), then each node's link
    cut, at each step its first local rank announced in the fault-free run."""
    if job.nodes is None:
        return []
    steps: dict[int, list[int]] = {}
    for node in range(job.nodes):
        rank = trigger_rank(job, node)
        steps[node] = sorted({r["info"]["n"] for r in traces.get((rank, 0), []) if r.get("event") == "phase"
                              and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in S.STEP_KINDS})
    found = [S.Point(trigger_rank(job, node), "rdzv" if node == 0 else "loss", step=n, node=node)
             for node in range(job.nodes) for n in steps[node]]
    found += [S.Point(trigger_rank(job, node), "link", step=n, node=node) for node in range(job.nodes)
              for n in steps[node]]
    return found


def _observe(job: S.JobSpec, point: S.Point, attempts: list[Any], traces: Any) -> Applied:
    """What attempt 0 of a node point did, or why it did nothing (``traces()``: every attempt's, for a
    link cut's stall)."""
    record = attempts[0].node if attempts else None
    if record is None:
        return Applied(f"no node fault at {point.id}", {}, outcome="not_reached",
                       skipped=f"rank {point.rank} (node {point.node}) asked for the node fault at step {point.step}, "
                               "but the attempt ended before the launcher answered")
    if record.get("error"):
        return Applied(describe(record), record, outcome="unsupported", skipped=record["error"])
    if point.mode == "link" and "down" in record:
        record["stall"] = stall(record, traces())
    return Applied(describe(record), record)


def _params(job: S.JobSpec, point: S.Point, seed: int) -> dict[str, Any]:
    return {"hold_s": job.node_hold_s} if point.mode == "link" else {}


FAMILY = Family(name="node", points=points, unavailable=lambda job: "" if job.nodes is None else None,
                observe=_observe, params=_params, restarts_torchrun=True)


# -- one attempt ----------------------------------------------------------------------------

@dataclass
class _Agent:
    node: int
    proc: subprocess.Popen[bytes]
    log: str
    replacement: bool = False


def _node_mark(mark: str, node: int) -> str:
    return f"{mark}/node{node}"


def _kill_node(agent: _Agent, mark: str) -> dict[str, Any]:
    """SIGKILL node ``agent.node``: its agent's process group and every process carrying its mark."""
    pids = sorted(set(group_members(agent.proc.pid)) | set(marked_with(ENV_NODE, _node_mark(mark, agent.node))))
    ts, mono = time.time(), time.monotonic()
    reaper.killpg(agent.proc.pid)
    reaper.kill_pids(pids)
    try:
        agent.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return {"agent_pid": agent.proc.pid, "pids": pids, "ts": ts, "mono": mono,
            "agent_returncode": agent.proc.returncode}


def _answer(trace_dir: str, record: dict[str, Any]) -> None:
    """Tell the waiting rank the launcher acted (``inproc``'s net wait reads ``NET_DOWN``)."""
    answer(trace_dir, S.NET_DOWN, {"down": "error" not in record, "error": record.get("error")})


def _link_up(lab: NetworkLab, record: dict[str, Any], why: str) -> None:
    try:
        record["up"] = {**lab.link_up(int(record["node"]), side="host"), "mono": time.monotonic(), "why": why}
        record["down_s"] = round(record["up"]["mono"] - record["down"]["mono"], 3)
    except (FaultError, OSError) as exc:
        record["up_error"] = str(exc)


def run_attempt(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None, mark: str,
                lab: NetworkLab | None) -> launch.AttemptOutcome:
    """Attempt ``attempt`` on ``job.nodes`` nodes: one agent per node, the node point answered.

    The ``AttemptLauncher`` (``chaos.launch.protocol``) ``explore`` calls for a ``--nodes`` job. ``outcome.returncodes`` and
    ``outcome.logs`` are each node's *last* agent's (a lost node's replacement);
    ``outcome.node`` records what the node fault did and how every agent ended.
    """
    if lab is None:
        raise ChaosError("a --nodes attempt needs its NetworkLab (explore.run_chain makes one per run chain)")
    n = int(job.nodes or 0)
    mark = launch.attempt_mark(mark, attempt)
    trace_dir, tmp, logs_dir = (os.path.join(scratch, d) for d in ("trace", "tmp", "logs"))
    for d in (trace_dir, tmp, logs_dir):
        os.makedirs(d, exist_ok=True)
    argv = job.argv(out, resume=attempt > 0)
    base = launch.job_env(job, out, trace_dir, tmp, mark, attempt, point)
    base[S.ENV_PYCACHE] = os.path.join(os.path.dirname(os.path.abspath(scratch)), "pycache")
    if launch._cancelled.is_set():
        raise launch.Cancelled("the exploration was interrupted: no attempt is started")
    if not netcut.command_exists(argv[0], job.cwd, base.get("PATH")):
        raise ConfigError(f"cannot start COMMAND {argv[0]!r}: No such file or directory")
    port = free_port()
    addrs = [lab.addr(i) for i in range(n)]
    outcome = launch.AttemptOutcome(attempt, argv)
    everyone: list[_Agent] = []

    def start(node: int, replacement: bool = False) -> _Agent:
        node_argv, extra = node_launch(argv, node, addrs, port, lab.ns_if(node))
        env = {**base, **extra, ENV_NODE: _node_mark(mark, node)}
        if replacement:  # a fresh agent: its workers are neither the armed attempt nor a torchelastic restart
            env.pop(S.ENV_POINT, None)
            env[S.ENV_ATTEMPT] = str(REPLACEMENT_BASE + attempt)
        log = os.path.join(logs_dir, f"attempt{attempt}-node{node}{'-replacement' if replacement else ''}.log")
        with open(log, "wb") as fh:
            proc = subprocess.Popen(netcut.in_netns(lab, node, node_argv), cwd=job.cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        reaper.track(proc, mark, marked=True)
        agent = _Agent(node, proc, log, replacement)
        everyone.append(agent)
        return agent

    record: dict[str, Any] | None = None
    armed = point is not None and point.family == "node" and attempt == 0
    started = time.monotonic()
    deadline = started + job.timeout_s
    hold_end: float | None = None
    settle_end: float | None = None
    agents: list[_Agent] = []
    try:
        agents = [start(i) for i in range(n)]
        quiet = (None if job.hang_timeout_s is None
                 else Silence(job.hang_timeout_s, trace_dir, [a.log for a in agents], time.monotonic()))
        while True:
            codes = [a.proc.poll() for a in agents]
            if all(c is not None for c in codes):
                break
            if armed and record is None and (req := launch.requests(trace_dir, S.NET_REQUEST)):
                assert point is not None and point.node is not None
                record = {"node": point.node, "mode": point.mode, "step": point.step, "rank": req[0].get("rank"),
                          "requested_mono": req[0].get("ts"), "hold_s": job.node_hold_s if point.mode == "link"
                          else None, "lab": {"suffix": lab.suffix, "bridge": lab.bridge, "addresses": addrs,
                                             "namespaces": [lab.ns_name(i) for i in range(n)]}}
                if point.mode == "link":
                    try:
                        record["down"] = {**lab.link_down(point.node, side="host"), "mono": time.monotonic()}
                        hold_end = time.monotonic() + job.node_hold_s
                    except (FaultError, OSError) as exc:
                        record["error"] = f"the link could not be cut: {exc}"
                else:
                    record["killed"] = _kill_node(agents[point.node], mark)
                    record["lost_log"] = agents[point.node].log
                    agents[point.node] = start(point.node, replacement=True)
                    record["replacement"] = {"agent_pid": agents[point.node].proc.pid, "mono": time.monotonic()}
                    if quiet is not None:
                        quiet.logs.append(agents[point.node].log)
                _answer(trace_dir, record)
                if quiet is not None:
                    quiet.resume(time.monotonic())  # the harness's own act: silence counts from here
            if hold_end is not None and record is not None and time.monotonic() >= hold_end and "up" not in record:
                _link_up(lab, record, "the hold was over")
                if quiet is not None:
                    quiet.resume(time.monotonic())
            if any(c not in (None, 0) for c in codes):
                settle_end = settle_end or time.monotonic() + NODE_SETTLE_S
                if time.monotonic() > settle_end:
                    break  # the other agents wait in a rendezvous that cannot complete
            if time.monotonic() > deadline:
                outcome.timed_out = True
                break
            held = hold_end is not None and record is not None and "up" not in record
            if quiet is not None and not held and quiet.hung(time.monotonic()) is not None:
                outcome.hung = quiet.limit_s
                break
            if launch._cancelled.is_set():
                break
            time.sleep(0.02)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot start COMMAND {argv[0]!r}: {exc.strerror}") from None
    finally:
        outcome.stopped = [i for i, a in enumerate(agents) if a.proc.poll() is None]
        for a in everyone:
            reaper.killpg(a.proc.pid)
        for a in everyone:
            try:
                a.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        outcome.leftovers = reaper.kill_marked(mark)
        if record is not None and "down" in record and "up" not in record:
            _link_up(lab, record, "the attempt ended within the hold")
        reaper.forget(*(a.proc for a in everyone))
        outcome.seconds = time.monotonic() - started
    outcome.returncodes = [a.proc.returncode for a in agents]
    outcome.logs = [a.log for a in agents]
    if record is not None:
        record["agents"] = [_ended(a, i in outcome.stopped, outcome.timed_out) for i, a in enumerate(agents)]
    outcome.node = record
    return outcome


def _ended(agent: _Agent, stopped: bool, timed_out: bool) -> dict[str, Any]:
    rc = agent.proc.returncode
    entry: dict[str, Any] = {"node": agent.node, "replacement": agent.replacement, "returncode": rc}
    if stopped:
        entry["ended"] = "timed_out" if timed_out else "stopped"
    elif rc == 0:
        entry["ended"] = "exited_0"
    else:
        entry["ended"] = "exited"
        entry["cause"] = netcut.clean_cause(log_cause(agent.log))
    return entry


# -- the chain and its evidence -------------------------------------------------------------

def _agents_phrase(agents: list[dict[str, Any]]) -> str:
    parts = []
    for a in agents:
        who = f"node {a['node']}'s {'replacement ' if a.get('replacement') else ''}agent"
        ended = a.get("ended")
        if ended == "exited_0":
            parts.append(f"{who} exited 0")
        elif ended == "stopped":
            parts.append(f"{who} was stopped when another agent had failed")
        elif ended == "timed_out":
            parts.append(f"{who} was stopped at the attempt's --timeout")
        else:
            cause = f" ({a['cause']})" if a.get("cause") else ""
            parts.append(f"{who} exited {a.get('returncode')}{cause}")
    return ", ".join(parts)


def describe(record: dict[str, Any]) -> str:
    """The fault line of a node point: what was done where, and how every agent of the attempt ended."""
    node, step = record.get("node"), record.get("step")
    if record.get("error"):
        return f"node {node} was not touched at its step {step}: {record['error']}"
    if record.get("mode") == "link":
        head = f"node {node}'s link down at its step {step} for {record.get('down_s', record.get('hold_s'))} s"
        if record.get("up", {}).get("why") == "the attempt ended within the hold":
            head += " (the attempt ended within the hold)"
        stall = record.get("stall")
        if stall is not None:
            stalled = stall["stalled"]
            head += (f" (rank(s) {', '.join(map(str, stalled))} announced no step while it was down)" if stalled
                     else " (every rank kept announcing steps while it was down)")
    else:
        killed = record.get("killed", {})
        host = ", the rendezvous host," if record.get("mode") == "rdzv" else ""
        head = (f"node {node}{host} lost at its step {step} (its agent and {max(0, len(killed.get('pids', [])) - 1)} "
                "other process(es) SIGKILLed; a replacement agent started on the node)")
    agents = record.get("agents")
    return f"{head}: {_agents_phrase(agents)}" if agents else head


def stall(record: dict[str, Any], traces: dict[tuple[int, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """Which ranks announced a step while node ``record['node']``'s link was down (monotonic clock)."""
    down, up = record["down"]["mono"], record.get("up", {}).get("mono", float("inf"))
    during, after = set(), set()
    for (rank, a), recs in traces.items():
        if a != 0:
            continue
        for r in recs:
            if r.get("event") == "phase" and r.get("name") == "chaos.probe" \
                    and r.get("info", {}).get("kind") in S.STEP_KINDS:
                ts = r.get("ts", 0.0)
                if down < ts < up:
                    during.add(rank)
                elif ts >= up:
                    after.add(rank)
    ranks = sorted({r for (r, a) in traces if a == 0})
    return {"progressed_during_cut": sorted(during), "stalled": [r for r in ranks if r not in during],
            "announced_after_cut": sorted(after)}


def no_effect(rec: PointRecord) -> str | None:
    """Why a link point did nothing to judge (every rank kept stepping through the cut, the job
    finished without a restart); None when it had an effect or is not a link point."""
    applied_ = rec.applied
    record = getattr(applied_, "record", None) or {}
    if rec.point.mode != "link" or "stall" not in record:
        return None
    first = rec.attempts[0] if rec.attempts else None
    restarted = any(0 < a < S.TORCHRUN_STRIDE for (_r, a) in rec.traces)
    if first is None or not first.ok or restarted or record["stall"]["stalled"]:
        return None
    return (f"every rank announced steps while node {record.get('node')}'s link was down and the job finished "
            "without a restart: the cut did nothing to judge")


def outcome_phrase(rec: PointRecord) -> str:
    """How the job came through a node point: survived without a relaunch, or died and was relaunched."""
    relaunches = len(rec.attempts) - 1
    if relaunches == 0:
        return "the job survived it without a relaunch by the harness"
    lost = "its rendezvous host" if rec.point.mode == "rdzv" else f"node {rec.point.node}"
    return f"the job died with {lost} and the harness relaunched every agent ({relaunches} time(s))"


# -- Chaos Mesh -----------------------------------------------------------------------------

def _k8s_name(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63]


def chaos_mesh_resources(job: S.JobSpec, chosen: Iterable[S.Point], *, namespace: str = "default",
                         job_name: str = "chaos-job") -> list[dict[str, Any]]:
    """The node points as Chaos Mesh resources against the pods of a Kubeflow PyTorchJob ``job_name``
    (node i = the pod of worker replica i): PodChaos ``pod-kill`` for a loss (node 0's: the
    rendezvous host's), NetworkChaos ``partition`` of the pod from the other workers for a link
    cut, lasting ``--node-hold``. Chaos Mesh has no trigger at a training step: the step is an
    annotation, applied when the job logs it (or from a Workflow after the measured delay)."""
    def pods(node: int | None) -> dict[str, Any]:
        labels = {"training.kubeflow.org/job-name": job_name, "training.kubeflow.org/replica-type": "worker"}
        if node is not None:
            labels["training.kubeflow.org/replica-index"] = str(node)
        return {"namespaces": [namespace], "labelSelectors": labels}

    out: list[dict[str, Any]] = []
    for p in chosen:
        if p.node is None:
            continue
        meta = {"name": _k8s_name(f"{job_name}-{p.id}"), "namespace": namespace,
                "annotations": {"chaos.harness/point": p.id, "chaos.harness/at-step": str(p.step),
                                "chaos.harness/replay": job.replay_command(p)}}
        if p.mode in ("loss", "rdzv"):
            out.append({"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "PodChaos", "metadata": meta,
                        "spec": {"action": "pod-kill", "mode": "one", "gracePeriod": 0, "selector": pods(p.node)}})
        else:
            others = pods(None)
            others["expressionSelectors"] = [{"key": "training.kubeflow.org/replica-index", "operator": "NotIn",
                                              "values": [str(p.node)]}]
            out.append({"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "NetworkChaos", "metadata": meta,
                        "spec": {"action": "partition", "mode": "one", "selector": pods(p.node), "direction": "both",
                                 "target": {"mode": "all", "selector": others},
                                 "duration": f"{job.node_hold_s:g}s"}})
    return out


def write_chaos_mesh(directory: str, job: S.JobSpec, chosen: Iterable[S.Point], **names: str) -> list[str]:
    """One YAML file per node point in ``directory`` (made if missing); the paths written."""
    import yaml

    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"--chaos-mesh {directory}: exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for res in chaos_mesh_resources(job, chosen, **names):
        path = os.path.join(directory, f"{res['metadata']['name']}.yaml")
        with open(path, "w") as f:
            f.write(f"# chaos run --point {res['metadata']['annotations']['chaos.harness/point']}: apply when the "
                    f"job reaches step {res['metadata']['annotations']['chaos.harness/at-step']}\n")
            yaml.safe_dump(res, f, sort_keys=False)
        paths.append(path)
    return paths
