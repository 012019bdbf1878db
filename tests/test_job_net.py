"""The ``net`` family of ``chaos run -- COMMAND``: a network cut between the ranks of a user's job.

Pure unit tests for the points (ids, enumeration from a fault-free trace, where the
family applies) and for the skip where no network namespace can be made; then a real
two-rank ``torch.distributed`` gloo job, each rank in its own network namespace, whose
rank 1 loses its link at a step: with a collective timeout shorter than the hold both
copies raise and the restart resumes from the last checkpoint (default run); with a
long one the partition outlasts the hold and every copy is SIGKILLed (slow). The real
runs need root (the same probe the built-in network tests use) and leave no namespace,
veth or bridge behind.
"""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import DEFAULT_NET_HOLD_S, JobSpec, parse_point
from faults import network

REPO = Path(__file__).resolve().parent.parent
OK, WHY = network.can_use_netns() if os.geteuid() == 0 else (False, "not root")
needs_netns = pytest.mark.skipif(not OK, reason=f"no network namespaces here: {WHY}")

# Two ranks train a linear model with DDP over gloo, rank 0 saving a checkpoint (temp file,
# fsync, rename) every second step; argv: OUT STEPS COLLECTIVE_TIMEOUT_S.
JOB = textwrap.dedent('''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    from chaos import probe

    out, steps, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    # start-up is generous (two interpreters importing torch on a loaded CI core can be
    # seconds apart); training runs on a group with the collective timeout under test
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = os.path.join(out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            state = torch.load(f, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        probe.resumed(step)
    gen = torch.Generator().manual_seed(7)
    xs, ys = torch.randn(steps, 8, 4, generator=gen), torch.randn(steps, 8, 1, generator=gen)
    while step < steps:
        loss = torch.nn.functional.mse_loss(model(xs[step] + rank), ys[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        probe.step(step, loss.item())
        if step % 2 == 0:
            if rank == 0:
                with open(ckpt + ".tmp", "wb") as f:
                    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                                "step": step}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier(group=group)
            probe.saved(step)
    if rank == 0:
        with open(os.path.join(out, "final.json"), "w") as f:
            json.dump({k: v.flatten().tolist() for k, v in model.module.state_dict().items()}, f)
    dist.barrier()
    dist.destroy_process_group()
''')


def job_script(tmp: Path, timeout_s: float, steps: int = 6) -> list[str]:
    path = tmp / "net_job.py"
    path.write_text(JOB)
    return [sys.executable, str(path), "{out}", str(steps), repr(timeout_s)]


# ---------------------------------------------------------------------- points (pure)
def _op(ord_: int, op: str, rel: str, ts: float, **kw: Any) -> dict[str, Any]:
    return {"event": "op", "op": op, "ord": ord_, "rel": rel, "path": f"/o/{rel}", "ts": ts, **kw}


def _step(n: int, ts: float) -> dict[str, Any]:
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}, "ts": ts}


def test_net_point_ids_round_trip_and_name_their_family() -> None:
    for text in ("rank1:step6:net", "rank0:op17:net"):
        p = parse_point(text)
        assert (p.id, p.family, p.in_rank) == (text, "net", True)
    fault = parse_point("rank1:step6:net").to_fault(hold_s=3.0)
    assert fault == {"kind": "netcut", "rank": 1, "step": 6, "attempt": 0, "params": {"hold_s": 3.0},
                     "spec": "rank1:step6:net"}
    with pytest.raises(ConfigError, match=r"rankR:stepN:kill\|term\|net"):
        parse_point("rank1:step6:cut")


def test_net_points_are_each_step_and_the_middle_of_each_save_of_every_rank() -> None:
    from chaos.plan.pointset import enumerate_points

    job = JobSpec(command=("python", "t.py", "{out}"), ranks=2)
    rank0 = [_step(1, 1.0), _op(0, "open", "ckpt.tmp", 1.1, created=True), _op(1, "write", "ckpt.tmp", 1.2),
             _op(2, "write", "ckpt.tmp", 1.3), _op(3, "fsync", "ckpt.tmp", 1.4), _op(4, "close", "ckpt.tmp", 1.5),
             _op(5, "rename", "ckpt", 1.6, src="/o/ckpt.tmp", dst="/o/ckpt"), _step(2, 2.0),
             _op(6, "open", "ckpt.tmp", 2.1, created=True), _op(7, "write", "ckpt.tmp", 2.2)]
    rank1 = [_step(1, 1.0), _step(2, 2.0)]
    traces = {(0, 0): rank0, (1, 0): rank1, (0, 1): [_step(3, 9.0)]}  # attempt 1 is no fault-free run
    ids = [p.id for p in enumerate_points(job, traces, None, ("net",))]
    assert ids == ["rank0:op1:net", "rank0:op5:net", "rank0:op7:net",
                   "rank0:step1:net", "rank0:step2:net", "rank1:step1:net", "rank1:step2:net"]
    again = enumerate_points(job, traces, None, ("net",))
    assert [p.id for p in again] == ids
    first = again[0]
    assert (first.kind, first.path, first.nth) == ("write", "ckpt.tmp", 1)
    # one copy, or a torchrun COMMAND, has no ranks the harness can cut apart: no point
    assert enumerate_points(JobSpec(command=("python", "t.py", "{out}")), traces, None, ("net",)) == []
    torchrun = JobSpec(command=("torchrun", "--nproc-per-node", "2", "t.py", "{out}"))
    assert enumerate_points(torchrun, traces, None, ("net",)) == []


def test_net_needs_ranks_the_harness_launches_and_the_hold_is_validated_and_replayed() -> None:
    with pytest.raises(ConfigError, match="torchrun COMMAND starts its workers itself"):
        JobSpec(command=("torchrun", "--nproc-per-node", "2", "t.py", "{out}"), faults=("net",))
    with pytest.raises(ConfigError, match="--ranks N with N >= 2"):
        JobSpec(command=("python", "t.py", "{out}"), faults=("net",))
    with pytest.raises(ConfigError, match="--ranks N with N >= 2"):
        JobSpec(command=("python", "t.py", "{out}"), ranks=1, faults=("kill", "net"))
    with pytest.raises(ConfigError, match="--net-hold must be a positive"):
        JobSpec(command=("python", "t.py", "{out}"), ranks=2, net_hold_s=0)
    job = JobSpec(command=("python", "t.py", "{out}"), ranks=2, faults=("net",), net_hold_s=2.5)
    assert job.replay_args()[-4:] == ["--faults", "net", "--net-hold", "2.5"]
    assert JobSpec.from_dict(job.to_dict()).net_hold_s == 2.5
    assert JobSpec(command=("python", "t.py", "{out}"), ranks=2).net_hold_s == DEFAULT_NET_HOLD_S
    assert "--net-hold" not in JobSpec(command=("python", "t.py", "{out}"), ranks=2).replay_args()


def test_the_fault_line_says_where_the_cut_landed_and_how_each_copy_ended() -> None:
    from chaos.nemesis import netcut

    net = {"rank": 1, "step": 6, "hold_s": 3.0}
    netcut.finish(net, [1, 1], [], {0: "RuntimeError: Timed out", 1: "RuntimeError: Timed out"}, False, False)
    assert netcut.describe(net) == ("rank 1's link down at its step 6 for a hold of 3 s: copies 0 and 1 raised "
                                    "(RuntimeError: Timed out)")
    assert net["failed_by_itself"] == [0, 1] and net["killed_after_hold"] == []
    net = {"rank": 1, "step": 6, "hold_s": 3.0}
    netcut.finish(net, [-9, -9], [0, 1], {}, True, False)
    assert netcut.describe(net) == "rank 1's link down at its step 6 for a hold of 3 s: still running after the " \
                                   "hold, SIGKILLed"
    net = {"rank": 0, "ord": 17, "op": "write", "path": "ckpt.pt.tmp", "hold_s": 2.0}
    netcut.finish(net, [-9, 1], [0], {1: "RuntimeError: Connection reset"}, False, False)
    assert netcut.describe(net) == ("rank 0's link down at its event 17 (write of ckpt.pt.tmp) for a hold of 2 s: "
                                    "copy 0 stopped by the harness when another copy failed; copy 1 raised "
                                    "(RuntimeError: Connection reset)")
    assert netcut.clean_cause("[rank1]: RuntimeError: x") == "RuntimeError: x"


# ---------------------------------------------------------------------- no namespaces (unit)
def test_without_network_namespaces_net_is_left_out_with_the_reason_and_a_net_point_is_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.judge.job import Golden, judge
    from chaos.nemesis import netcut
    from chaos.plan.pointset import kinds_to_explore
    from chaos.run.explore import new_run, run_chain

    monkeypatch.setattr(netcut, "_available", (False, "not root: network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN"))
    job = JobSpec(command=("python", "t.py", "{out}"), ranks=2)
    kinds, notes = kinds_to_explore(job)
    assert "net" not in kinds
    assert ("network cuts between ranks are not explored: network namespaces cannot be made here: not root: "
            "network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN") in notes
    torchrun = JobSpec(command=("torchrun", "--nproc-per-node", "2", "t.py", "{out}"))
    assert any("a torchrun COMMAND starts its workers itself" in n for n in kinds_to_explore(torchrun)[1])
    assert not any("network" in n for n in kinds_to_explore(JobSpec(command=("python", "t.py", "{out}")))[1])
    # asked for explicitly: the family stays, and each of its points is skipped with the reason
    asked = JobSpec(command=("python", "t.py", "{out}"), ranks=2, faults=("net",))
    assert kinds_to_explore(asked) == (("net",), [])
    rec = run_chain(asked, new_run(str(tmp_path), "p"), parse_point("rank1:step3:net"))
    v = judge(asked, Golden(out=str(tmp_path), results=[], tolerance=False, checkpoints={}, acks=False), rec)
    assert (v.verdict, v.outcome) == ("skipped", "unsupported")
    assert v.summary == ("a network cut between ranks cannot be made here: network namespaces cannot be made here: "
                         "not root: network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN")
    assert rec.attempts == []


# A pure-Python two-rank job that talks over TCP like a collective (each step both ranks send
# and receive one byte; argv: OUT STEPS SOCKET_TIMEOUT_S, 0 for none), rank 0 saving its step:
# the cut, the hold, the timeout and the clean-up without torch's start-up time.
SOCKETS = textwrap.dedent('''
    import os, socket, sys, time
    from chaos import probe

    out, steps, tmo = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rank, addr, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    print("iface", os.environ.get("GLOO_SOCKET_IFNAME"), flush=True)  # a network lab's veth, or None
    if rank == 0:
        conn, _ = socket.create_server((addr, port)).accept()
    else:
        for _ in range(400):
            try:
                conn = socket.create_connection((addr, port))
                break
            except OSError:
                time.sleep(0.02)
    conn.settimeout(tmo or None)
    ckpt = os.path.join(out, "step")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    if step:
        probe.resumed(step)
    while step < steps:
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"
        step += 1
        probe.step(step)
        if rank == 0:
            with open(ckpt + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(ckpt + ".tmp", ckpt)
            probe.saved(step)
    if rank == 0:
        with open(os.path.join(out, "final.txt"), "w") as f:
            f.write(str(step))
''')


def sockets_job(tmp: Path, steps: int, sock_timeout_s: float, **kw: Any) -> JobSpec:
    path = tmp / "sockets_job.py"
    path.write_text(SOCKETS)
    return JobSpec(command=(sys.executable, str(path), "{out}", str(steps), repr(sock_timeout_s)), ranks=2,
                   result_globs=("final.txt",), faults=("net",), cwd=str(REPO), **kw)


@needs_netns
def test_labs_are_torn_down_on_an_exception_and_by_teardown_all() -> None:
    from chaos.nemesis import netcut

    with pytest.raises(RuntimeError, match="boom"):
        with netcut.lab_for(2) as lab:
            x = lab.suffix
            assert network.leftovers(x) == sorted([f"link:cxb{x}", f"link:cxh{x}0", f"link:cxh{x}1",
                                                   f"netns:chaos-{x}-r0", f"netns:chaos-{x}-r1"])
            raise RuntimeError("boom")
    assert network.leftovers(lab.suffix) == []
    held = netcut.lab_for(2)
    lab = held.__enter__()  # as an interrupted run chain leaves it
    assert network.leftovers(lab.suffix)
    netcut.teardown_all()
    assert network.leftovers(lab.suffix) == [] and lab.suffix not in netcut._labs
    held.__exit__(None, None, None)  # the chain's own teardown afterwards is harmless


@needs_netns
def test_a_cut_outlasting_the_attempts_timeout_a_cut_that_did_nothing_and_one_never_reached(
        tmp_path: Path, labs: list[str]) -> None:
    from chaos.run.explore import explore

    hung = sockets_job(tmp_path, steps=4, sock_timeout_s=0, net_hold_s=60.0, timeout_s=4.0)
    points = [parse_point(p) for p in ("rank1:step2:net", "rank1:step4:net", "rank1:step9:net")]
    exp = explore(hung, only=points, scratch_base=str(tmp_path))
    assert _ours(labs) == []
    timed, idle, never = exp.results
    # the partition outlasted --timeout (no socket timeout, a 60 s hold): stopped there, restarted
    net = timed.record.attempts[0].net
    assert timed.record.attempts[0].timed_out and [c["ended"] for c in net["copies"]] == ["timed_out"] * 2
    assert net["up"]["action"] == "link_up" and timed.record.attempts[1].ok
    assert (timed.verdict.verdict, timed.verdict.outcome) == ("pass", "pass"), timed.verdict.summary
    assert timed.verdict.summary.startswith("rank 1's link down at its step 2 for a hold of 60 s: copies 0 and 1 "
                                            "stopped at the attempt's --timeout; then ")
    # at the last step nothing talks any more: the job finished, the cut did nothing
    assert (idle.verdict.verdict, idle.verdict.outcome) == ("skipped", "no_effect")
    assert idle.verdict.summary.startswith("rank 1's link down at its step 4 for a hold of 60 s: copies 0 and 1 "
                                           "exited 0: every copy finished within the hold")
    # no step 9: the request never came
    assert (never.verdict.verdict, never.verdict.outcome) == ("skipped", "not_reached")
    assert never.verdict.summary == "the point was not reached: rank 1 announced no step 9 in the armed attempt"
    assert never.record.attempts[0].net is None


@needs_netns
def test_only_network_cut_points_and_the_second_fault_free_run_get_network_namespaces(
        tmp_path: Path, labs: list[str]) -> None:
    """Where network cuts are explored, a net point's chain runs in a lab of its own, and so does the
    second fault-free run (which shows the job runs the same way there); the first, and every other
    point, run outside one, where their copies may be forked or started ahead."""
    import dataclasses

    from chaos.run.explore import explore

    job = dataclasses.replace(sockets_job(tmp_path, steps=4, sock_timeout_s=2.0, net_hold_s=3.0),
                              faults=("kill", "net"))
    exp = explore(job, only=[parse_point("rank0:step2:kill"), parse_point("rank1:step2:net")], keep=True,
                  scratch_base=str(tmp_path))
    assert _ours(labs) == []
    assert exp.reference.netlab
    kill, net = exp.results
    assert net.record.attempts[0].net is not None and kill.record.attempts[0].net is None
    [root] = tmp_path.glob("chaos-job-*")

    def ifaces(run: str) -> set[str]:
        logs = sorted((root / run / "logs").glob("attempt*-copy*.log"))
        assert logs, run
        return {line.split()[1] for p in logs for line in p.read_text().splitlines() if line.startswith("iface ")}

    assert ifaces("golden-0") == {"None"}
    assert ifaces("point-00000") == {"None"}  # the kill point, both attempts
    for run in ("golden-1", "point-00001"):  # the second fault-free run; the net point, both attempts
        lab = ifaces(run)
        assert lab and "None" not in lab, (run, lab)
    assert (kill.verdict.verdict, net.verdict.verdict) == ("pass", "pass"), (kill.verdict.summary, net.verdict.summary)


# ---------------------------------------------------------------------- a real 2-rank gloo job
def _ours(labs: list[str]) -> list[str]:
    """What is left of the labs this test made (``labs``): the other pytest worker may have labs of
    its own up meanwhile (the zygote and workload tests explore net too), which are not this test's."""
    assert labs, "the test made no network lab: nothing was checked"
    return sorted(x for suffix in labs for x in network.leftovers(suffix))


@pytest.fixture
def labs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The suffix of every network lab this test's explorations made (``netcut.lab_for``)."""
    from chaos.nemesis import netcut

    made: list[str] = []

    class Recorded(network.NetworkLab):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self.suffix)

    monkeypatch.setattr(netcut, "NetworkLab", Recorded)
    return made


def _explore(tmp: Path, job: JobSpec, point: str) -> Any:
    from chaos.run.explore import explore

    return explore(job, only=parse_point(point), jobs=2, scratch_base=str(tmp))


@needs_netns
@pytest.mark.slow  # a 20 s hold; the per-commit run keeps the shorter cuts of the tests above
def test_a_cut_longer_than_the_collective_timeout_makes_both_copies_raise_and_the_restart_resumes(
        tmp_path: Path, labs: list[str]) -> None:
    job = JobSpec(command=tuple(job_script(tmp_path, timeout_s=2.0)), ranks=2, result_globs=("final.json",),
                  faults=("net",), net_hold_s=20.0, cwd=str(REPO))
    exp = _explore(tmp_path, job, "rank1:step3:net")
    assert _ours(labs) == []  # namespaces, veths and bridge of every run are gone
    assert exp.reference.netlab
    [res] = exp.results
    v, rec = res.verdict, res.record
    first = rec.attempts[0]
    net = first.net
    assert (net["rank"], net["step"], net["hold_s"], net["side"]) == (1, 3, 20.0, "host")
    assert net["down"]["action"] == "link_down" and net["up"]["action"] == "link_up"
    assert network.leftovers(net["lab"]["suffix"]) == []
    assert net["killed_after_hold"] == [] and net["failed_by_itself"]  # the job failed by itself
    # a copy raises gloo's timeout; under load its peer may instead die of gloo's abort (a signal)
    ended = [c["ended"] for c in net["copies"]]
    assert set(ended) <= {"raised", "stopped", "signal"} and "raised" in ended, ended
    assert all("Timed out" in c["cause"] for c in net["copies"] if c["ended"] == "raised")
    assert v.summary.startswith("rank 1's link down at its step 3 for a hold of 20 s: ")
    assert "raised (RuntimeError: " in v.summary
    assert not first.ok and len(rec.attempts) == 2 and rec.attempts[1].ok
    assert (v.verdict, v.outcome) == ("pass", "pass"), v.summary
    durable = v.oracles["durability"].evidence["ranks"]
    assert durable["1"]["resumed_at"] == durable["1"]["newest_complete"] == 2
    assert v.oracles["result_files"].result == "pass" and v.oracles["loss_continuity"].result == "pass"
    d = res.to_dict()
    assert d["faults"][0]["kind"] == "netcut" and d["faults"][0]["params"] == {"hold_s": 20.0}
    assert d["fault_applied"]["killed_after_hold"] == [] and d["attempts"][0]["net"]["rank"] == 1
    assert d["replay"] == job.replay_command(parse_point("rank1:step3:net"))
    assert d["replay"].endswith("--point rank1:step3:net -- " + shlex.join(job.command))
    assert "--net-hold 20.0" in d["replay"]


@pytest.mark.slow
@needs_netns
def test_a_partition_that_outlasts_the_hold_mid_save_is_sigkilled_and_recorded_as_such(tmp_path: Path, labs: list[str]) -> None:
    from chaos.judge.job import judge
    from chaos.run.explore import new_run, reference, run_chain

    job = JobSpec(command=tuple(job_script(tmp_path, timeout_s=120.0)), ranks=2, result_globs=("final.json",),
                  faults=("net",), net_hold_s=1.5, cwd=str(REPO))
    root = tmp_path / "root"
    root.mkdir()
    ref, _ = reference(job, str(root), jobs=2)
    assert ref.netlab and ref.to_dict()["network"].startswith("each rank in its own network namespace")
    # the first write of rank 0's second checkpoint: the cut lands in the middle of a save
    saves = [p for p in ref.points if p.op is not None and p.path == "ckpt.pt.tmp" and p.kind == "write"]
    assert len(saves) == 3 and all(p.rank == 0 for p in saves)
    point = saves[1]
    rec = run_chain(job, new_run(str(root), "point"), point, netlab=ref.netlab)
    assert _ours(labs) == []
    v = judge(job, ref.golden, rec)
    net = rec.attempts[0].net
    assert (net["rank"], net["ord"], net["op"], net["path"]) == (0, point.op, "write", "ckpt.pt.tmp")
    assert net["hold_s"] == 1.5 and net["killed_after_hold"] == [0, 1] and net["failed_by_itself"] == []
    assert v.summary.startswith(f"rank 0's link down at its event {point.op} (write of ckpt.pt.tmp) for a hold of "
                                "1.5 s: still running after the hold, SIGKILLed; then ")
    assert rec.attempts[0].returncodes == [-9, -9] and rec.attempts[1].returncodes == [0, 0]
    assert (v.verdict, v.outcome) == ("pass", "pass"), v.summary
    # rank 0's save needs no network: it completed, then the barrier after it hung, so the
    # step-4 checkpoint was never acknowledged, yet it is what the restart resumed from
    assert v.oracles["durability"].evidence["ranks"]["0"]["newest_complete"] == 2
    assert v.oracles["durability"].evidence["ranks"]["0"]["resumed_at"] == 4


def test_the_cli_takes_the_hold_and_says_where_net_applies() -> None:
    from chaos.cli.job import build, help_epilog

    _args, job = build(["--ranks", "2", "--faults", "net", "--net-hold", "2", "--", "python", "t.py", "{out}"])
    assert (job.faults, job.net_hold_s) == (("net",), 2.0)
    text = " ".join(help_epilog().split())
    assert "--net-hold S" in text and "is not available for a torchrun COMMAND" in text
