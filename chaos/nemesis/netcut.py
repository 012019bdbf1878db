"""``net``: a network cut between the ranks of a user's job (``chaos run --ranks N -- COMMAND``).

The built-in workload's network drop, made for a job the harness launches itself
(``--ranks N``, N >= 2). It reuses :class:`faults.network.NetworkLab` (one network
namespace per rank on a private veth bridge) and adds only what a job needs:

- ``explore.py`` makes one lab per net point's run chain with :func:`lab_for` (and one for
  the second fault-free run, which shows the job runs the same way there as outside: the
  first runs outside, as every other point does) when the exploration uses labs at all
  (:func:`usable`: the job's own shape, then root and iproute2). Every lab is
  registered until it is torn down, so :func:`teardown_all` (``explore``'s ``finally``)
  removes whatever an interrupt or an exception left: namespaces, veths, bridge;
- ``launch.py`` starts each copy inside its rank's namespace (:func:`in_netns`:
  ``nsenter --net``, which only enters the network namespace and then execs COMMAND,
  so the copy keeps its pid, session and mount namespace), with ``MASTER_ADDR`` =
  rank 0's lab address and ``GLOO_SOCKET_IFNAME`` = the rank's veth
  (``NetworkLab.rank_env``). When the armed rank reaches its point (``inproc.py``:
  an announced step, or right after a file event of a save) it leaves a
  ``net-request``; the poll loop answers it with :func:`cut` (the rank's host-side veth
  down: every packet to or from it is dropped, as with a pulled cable) and the rank
  goes on. The link stays down for ``--net-hold`` seconds: the job fails by itself
  (its collectives raise at their timeout) or it is SIGKILLed when the hold is over;
  either way :func:`restore` brings the link back up before the restart;
- :func:`finish` records how every copy ended, and :func:`describe` says it in one
  line for the verdict ("rank 1's link down at its step 6 for a 3 s hold: copies 0
  and 1 raised (RuntimeError: ...)").

With ``--launcher docker`` the lab is a network of the engine instead
(``chaos.launch.containernet.ContainerNetwork``, the same calls): every copy's container
joins it under its rank's alias, and the cut disconnects the rank's container from it; no
namespace, veth or iproute2 is needed on this side.

A torchrun COMMAND starts its workers itself, so the harness cannot put them in
namespaces: ``--faults net`` is a ConfigError there (``JobSpec.net_unavailable``), and
the default leaves the family out with that reason. Without root the family is left
out with the probe's reason, and asked for explicitly its points are skipped with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from typing import Any

from chaos.launch.answers import answer
from chaos.launch.containernet import ContainerNetwork
from chaos.launch.output import clip
from chaos.model import jobspec as S
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces, mid_save_points
from chaos.scratch import claim_netns
from faults import FaultError
from faults.network import NetworkLab, can_use_netns

_available: tuple[bool, str] | None = None
_labs: dict[str, NetworkLab] = {}  # suffix -> lab not yet torn down (for teardown_all)
_labs_lock = threading.Lock()
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")


def available() -> tuple[bool, str]:
    """Whether network namespaces, veths and a bridge can be made here (probed once per process)."""
    global _available
    if _available is None:
        _available = can_use_netns()
    return _available


def usable(job: S.JobSpec) -> tuple[bool, str]:
    """Whether this job's ranks can be cut apart here, and why not: the job's shape first
    (``--ranks N >= 2``, not torchrun), then this machine (root, iproute2; with ``--launcher
    docker`` the engine's own networks, whose engine the command line has already reached)."""
    why = job.net_unavailable
    if why is not None:
        return False, why
    if job.launcher == "docker":
        return True, "each run chain's containers on a network of the engine (containernet.py)"
    ok, why = available()
    return (True, why) if ok else (False, f"network namespaces cannot be made here: {why}")


@contextlib.contextmanager
def lab_for(n_ranks: int, docker: bool = False) -> Iterator[NetworkLab | ContainerNetwork]:
    """A set-up lab of ``n_ranks`` namespaces for one run chain (``docker``: a network of the engine
    its containers join, ``chaos.launch.containernet``), torn down when the block ends.

    FaultError / OSError if it cannot be set up (``NetworkLab.setup`` has removed what it made).
    """
    lab: NetworkLab | ContainerNetwork = ContainerNetwork(n_ranks) if docker else NetworkLab(n_ranks)
    if not docker:
        claim_netns(lab.suffix)  # swept by the next harness if this one is killed
    with _labs_lock:
        _labs[lab.suffix] = lab
    try:
        lab.setup()
        yield lab
    finally:
        try:
            lab.teardown()
        finally:
            with _labs_lock:
                _labs.pop(lab.suffix, None)


def teardown_all() -> None:
    """Tear down every lab still registered (an interrupt cut a run chain short)."""
    with _labs_lock:
        labs = list(_labs.values())
    for lab in labs:
        try:
            lab.teardown()
        except (FaultError, OSError):
            continue
        with _labs_lock:
            _labs.pop(lab.suffix, None)


def in_netns(lab: NetworkLab, rank: int, argv: list[str]) -> list[str]:
    """``argv`` run inside rank ``rank``'s namespace (the process execs COMMAND: same pid)."""
    if shutil.which("nsenter"):
        return ["nsenter", f"--net={lab.ns_path(rank)}", "--", *argv]
    return ["ip", "netns", "exec", lab.ns_name(rank), *argv]


def command_exists(cmd: str, cwd: str, path: str | None) -> bool:
    """What ``Popen`` would find: a path (relative to the job's cwd) or a name on PATH. Checked
    before a copy is started through ``nsenter``, which would only exit 127 for a missing one."""
    if os.sep in cmd:
        return os.path.exists(os.path.join(cwd, cmd))
    return shutil.which(cmd, path=path) is not None


def where(net: dict[str, Any]) -> str:
    """Where the cut landed: ``at its step 6`` or ``at its event 17 (write of ckpt.pt.tmp)``."""
    if net.get("step") is not None:
        phase = f", in the {net['phase']} phase of its save" if net.get("phase") else ""
        return f"at its step {net['step']}{phase}"
    what = f" ({net['op']} of {net['path']})" if net.get("op") and net.get("path") else ""
    return f"at its event {net.get('ord')}{what}"


def _short(path: Any, out: str) -> Any:
    root = os.path.realpath(out)
    if isinstance(path, str) and path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    return path


def cut(lab: NetworkLab | ContainerNetwork | None, req: dict[str, Any], hold_s: float, trace_dir: str, out: str) -> dict[str, Any]:
    """Answer a rank's net request: its link down now, the answer left for the waiting rank.

    The returned record (``AttemptOutcome.net``) carries ``down`` (the link_down record) or
    ``error`` (why no cut was made; the point is then skipped).
    """
    net: dict[str, Any] = {"rank": req.get("rank"), "step": req.get("step_n"), "ord": req.get("ord"),
                           "op": None if req.get("op") == "step" else req.get("op"),
                           "path": _short(req.get("path"), out), "hold_s": hold_s, "side": "host",
                           **({"phase": req["phase"]} if req.get("phase") else {}),
                           "requested_ts": req.get("ts")}
    if lab is None:
        net["error"] = "the copies were not started in network namespaces"
    else:
        net["lab"] = {"suffix": lab.suffix, "bridge": lab.bridge,
                      "namespaces": [lab.ns_name(r) for r in range(lab.n_ranks)],
                      "addresses": [lab.addr(r) for r in range(lab.n_ranks)]}
        try:
            net["down"] = lab.link_down(int(req.get("rank", 0)), side="host")
        except (FaultError, OSError, ValueError) as exc:
            net["error"] = f"the link could not be cut: {exc}"
    answer(trace_dir, S.NET_DOWN, {"down": "down" in net, "error": net.get("error")})
    return net


def restore(lab: NetworkLab | ContainerNetwork | None, net: dict[str, Any]) -> None:
    """The link back up (after every copy was stopped): the restart runs with the network back."""
    if lab is None or "down" not in net or "up" in net:
        return
    try:
        net["up"] = lab.link_up(int(net["rank"]), side="host")
        net["down_s"] = round(net["up"]["ts"] - net["down"]["ts"], 3)
    except (FaultError, OSError) as exc:
        net["up_error"] = str(exc)


def finish(net: dict[str, Any], returncodes: list[int | None], stopped: list[int], causes: dict[int, str],
           held_out: bool, timed_out: bool) -> None:
    """How each copy ended, into ``net["copies"]``: raised (with the exception line), exited,
    killed by a signal of its own, stopped by the harness when another copy failed, SIGKILLed
    when the hold was over (the partition lasted), or stopped at the attempt's timeout."""
    copies = []
    for i, rc in enumerate(returncodes):
        entry: dict[str, Any] = {"copy": i, "returncode": rc}
        if i in stopped:
            entry["ended"] = "killed_after_hold" if held_out else ("timed_out" if timed_out else "stopped")
        elif rc == 0:
            entry["ended"] = "exited_0"
        elif rc is not None and rc < 0:
            entry["ended"] = "signal"
        elif causes.get(i):
            entry["ended"], entry["cause"] = "raised", causes[i]
        else:
            entry["ended"] = "exited"
        copies.append(entry)
    net["copies"] = copies
    net["killed_after_hold"] = [c["copy"] for c in copies if c["ended"] == "killed_after_hold"]
    net["failed_by_itself"] = [c["copy"] for c in copies if c["ended"] in ("raised", "exited", "signal")]


def clean_cause(line: str) -> str:
    """An exception line without torch's ``[rankN]:`` prefix, cut between words when long."""
    return clip(_RANK_PREFIX.sub("", line))


def _phrase(c: dict[str, Any]) -> str:
    ended, rc = c.get("ended"), c.get("returncode")
    if ended == "killed_after_hold":
        return "still running after the hold, SIGKILLed"
    if ended == "timed_out":
        return "stopped at the attempt's --timeout"
    if ended == "stopped":
        return "stopped by the harness when another copy failed"
    if ended == "exited_0":
        return "exited 0"
    if ended == "signal" and isinstance(rc, int):
        return f"killed by {signal.Signals(-rc).name}"
    if ended == "raised":
        return f"raised ({c['cause']})"
    return f"exited {rc}"


def _who(copies: list[int]) -> str:
    if len(copies) == 1:
        return f"copy {copies[0]}"
    return "copies " + ", ".join(str(c) for c in copies[:-1]) + f" and {copies[-1]}"


def describe(net: dict[str, Any]) -> str:
    """The fault line: where the cut landed, the hold, and how every copy ended."""
    head = f"rank {net.get('rank')}'s link"
    if net.get("error"):
        return f"{head} was not cut {where(net)}: {net['error']}"
    head += f" down {where(net)}{',' if net.get('phase') else ''} for a hold of {net.get('hold_s', 0):g} s"
    copies = net.get("copies")
    if not copies:
        return head
    groups: dict[str, list[int]] = {}
    for c in copies:
        groups.setdefault(_phrase(c), []).append(c["copy"])
    if len(groups) == 1 and "killed_after_hold" in {c["ended"] for c in copies}:
        return f"{head}: {next(iter(groups))}"
    return f"{head}: " + "; ".join(f"{_who(who)} {phrase}" for phrase, who in groups.items())


# -- the family's planning hooks (chaos.nemesis.family) ---------------------------------------

def _points(job: S.JobSpec, traces: Traces, facts: Facts | None) -> list[S.Point]:
    """A rank's link cut in the middle of its saves (right after the first write to a file since it
    was opened, and after each rename), then at each step it announced."""
    return [] if job.net_unavailable is not None else mid_save_points(traces, facts, "net")


def _notes(job: S.JobSpec, traces: Traces, facts: Facts, points: list[S.Point]) -> list[str]:
    if points or job.net_unavailable is not None:
        return []
    return ["network cuts are not explored: the job announced no step and traced no save"]


def _unavailable(job: S.JobSpec) -> str | None:
    ok, why = usable(job)
    if ok:
        return None
    several = job.torchrun or job.ranks is not None and job.ranks >= 2  # one process has no ranks to cut apart
    return f"network cuts between ranks are not explored: {why}" if several else ""


def _observe(job: S.JobSpec, point: S.Point, attempts: list[Any], traces: Any) -> Applied:
    """What attempt 0 of a net point did: the cut and how every copy ended, or why there was none."""
    net = attempts[0].net
    where = f"at its step {point.step}" if point.step is not None else f"at its event {point.op}"
    if net is None:
        return Applied(f"no network cut {where}", {"hold_s": job.net_hold_s}, outcome="not_reached",
                       skipped=f"rank {point.rank} asked for a network cut {where}, but the attempt ended before "
                               "the launcher cut its link")
    if net.get("error"):
        return Applied(describe(net), net, outcome="unsupported",
                       skipped=f"rank {point.rank}'s link was not cut {where}: {net['error']}")
    return Applied(describe(net), net)


FAMILY = Family(name="net", points=_points, notes=_notes, unavailable=_unavailable, observe=_observe,
                params=lambda job, point, seed: {"hold_s": job.net_hold_s})
