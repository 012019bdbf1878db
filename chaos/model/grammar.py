"""One grammar for every place to break a target, read for ``--point`` and ``--fault``.

A place is written ``WHO:WHERE:WHAT``, then ``,KEY=VALUE`` settings where the target takes
them::

    WHO    rank<R> | node<N> | disk | ckpt (the newest checkpoint) | all (every rank)
    WHERE  step<S> (an announced step) | op<N> (a rank's N-th traced file event) | full (a disk);
           left out for a built-in I/O fault, which its keys place (op=write,nth=3)
    WHAT   what happens there: kill, term, net, before, after, torn, bitflip, power, ...

Both targets: ``rank1:step11:kill``, ``rank0:step5:term``, ``rank1:step5:net``.
The built-in workload's faults (:class:`chaos.model.fault.Fault`) add settings and more
places: ``rank1:step11:kill,phase=vote,lost=true``, ``rank0:step4:crash,op=write,nth=1``,
``rank0:eio,op=fsync``, ``ckpt:step8:bitflip,bits=2``, ``disk:step8:full,free=4096``,
``all:step8:power,seed=1``. A job's points (:class:`chaos.model.point.Point`) are found in
its trace: ``rank0:op17:before``, ``rank0:op9:power:s2``, ``rank0:op9:stale:step6``,
``disk:full:8192``, ``node1:step3:loss``, with an anchor ``@write:ckpt/a.pt:3``.

The older spelling of a built-in fault, ``KIND:key=value`` (``kill:rank=1,step=11``), is read
for both too, and is what a built-in scenario's replay command still prints; a job's step
kill, SIGTERM and network cut may be written that way (``kill:rank=0,step=5``). Every
built-in fault is also a job's point, its id the fault as written (``Point.builtin``), so
``chaos run --as-job --fault ...`` runs it: a step kill, SIGTERM or hang with its
``grace=``/``linger=``, a container restarted in place (``restart``, ``--launcher docker``:
``chaos.nemesis.restart``), a kill's ``lost=true`` (the restarts run on one rank fewer:
``chaos.nemesis.shrink``), an I/O fault (the interposer rule it
names), ``ckpt:stepS:KIND`` (the newest checkpoint struck at rest), ``disk:stepS:full`` and
``all:stepS:power`` (a stand-in for the power cuts of that save). A place one target cannot
take is refused naming the other (``--point`` or ``--fault``), every error naming the text. Called by the command line (``chaos.cli``), the planners and the replay
of a results file.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from chaos.errors import ConfigError
from chaos.model.contract import AT_REST_FAMILIES, MODES, OP_MODES, ROT_MODES, STEP_MODES
from chaos.model.fault import COMMON_KEYS, FAULT_KINDS, Fault
from chaos.model.keyvalue import _parse_value
from chaos.model.point import NODE_MODES, Point

_POINT_RE = re.compile(rf"rank(\d+):op(\d+):({'|'.join(OP_MODES)})(?::s(\d+)|:step(\d+))?(?:=([^@]+))?"
                       rf"|rank(\d+):step(\d+):({'|'.join(STEP_MODES)})|disk:full:(\d+)")
_NODE_POINT = re.compile(rf"node(\d+):step(\d+):({'|'.join(NODE_MODES)})")


THEN_MODES = (*MODES, "power")  # a second fault: a kill at the restart's event N, or a power cut right after it
_THEN = re.compile(rf"\+rank(\d+):op(\d+):({'|'.join(THEN_MODES)})$")
# families whose chain restarts the job with the harness's own launcher (explore._chain): a second
# fault can strike their resume. A full disk, a network cut, a node or a Slurm action has a chain of its own.
THEN_FAMILIES = ("kill", "term", "power", "errno", *AT_REST_FAMILIES)


def _read_point(text: str) -> Point:
    """A point, with a second fault in its resume where ``+rankR:opN:MODE`` ends it (:data:`_THEN`)."""
    stripped = text.strip()
    m = _THEN.search(stripped)
    if m is None:
        return _read_one(stripped)
    first = _read_one(stripped[:m.start()])
    if first.family not in THEN_FAMILIES:
        raise ConfigError(f"--point {text!r}: a second fault (+rankR:opN:MODE) follows a point of "
                          f"{', '.join(THEN_FAMILIES)}, not of {first.family}")
    then = Point(int(m.group(1)), m.group(3), op=int(m.group(2)), attempt=1)
    return dataclasses.replace(first, then=then)


def _read_one(text: str) -> Point:
    """One point: a kill, hang or cut at a named phase (``rank1:step23:kill,phase=vote``), else any place
    (:func:`_read_place`)."""
    if (m := _PHASE_POINT.fullmatch(text.strip())) is not None:
        return Point(int(m.group(1)), m.group(3), step=int(m.group(2)), phase=m.group(4))
    return _read_place(text)


def _read_place(text: str) -> Point:
    """``rank0:op17:before`` | ``rank1:op3:bitflip`` | ``rank0:op9:power`` | ``rank0:op4:eio`` |
    ``rank0:op9:payload`` | ``rank0:op9:stale:step6`` | ``rank1:op4:swap`` |
    ``rank0:op9:payload=ckpt/step-6/manifest.pkl`` (the file, where event 9 completed several) |
    ``rank0:op9:power:s2`` | ``rank1:op3:truncate:step5`` | ``rank1:op4:net`` | ``rank0:step5:kill`` | ``rank0:step5:term`` | ``rank1:step5:net`` | ``disk:full:8192`` |
    ``rank0:step5:requeue`` | ``rank0:step5:preempt`` | ``rank0:step5:node`` | ``rank0:op1:requeue`` (sched) |
    ``node1:step5:loss`` | ``node0:step5:rdzv`` | ``node1:step5:link`` (``_parse_node_point``).

    An event point may carry its anchor (``Point.replay_id``): ``rank0:op17:before@write:ckpt/a.pt:3``
    fires at rank 0's third write to ``{out}/ckpt/a.pt``, whatever its ordinal in this run.
    """
    base, sep, anchor = text.strip().partition("@")
    if sep:
        point = _read_one(base)
        if point.op is None:
            raise ConfigError(f"malformed --point {text!r}: only an event point (rankR:opN:MODE) takes an anchor "
                              "(@KIND:PATH:N)")
        return dataclasses.replace(point, anchored=True, **_parse_anchor(text, anchor))
    if text.strip().startswith("node"):
        return _parse_node_point(text)
    m = _POINT_RE.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"malformed --point {text!r}: expected rankR:opN:MODE (MODE one of {', '.join(OP_MODES)}), "
                          f"rankR:stepN:{'|'.join(STEP_MODES)} or disk:full:BYTES")
    rank, op, mode, state, at_step, file, srank, step, smode, size = m.groups()
    if size is not None:
        if int(size) < 1:
            raise ConfigError(f"malformed --point {text!r}: a full disk needs a size of at least one byte")
        return Point(0, "diskfull", size=int(size))
    if step is not None:
        return Point(int(srank), smode, step=int(step))
    if state is not None and (mode != "power" or int(state) < 1):
        raise ConfigError(f"malformed --point {text!r}: only a power point names a crash state (:s1, :s2, ...)")
    if at_step is not None and mode not in ROT_MODES:
        raise ConfigError(f"malformed --point {text!r}: only a fault at rest waits for a step (:stepN): "
                          f"{', '.join(ROT_MODES)}")
    if file is not None:
        if mode not in ROT_MODES:
            raise ConfigError(f"malformed --point {text!r}: only a fault at rest names the file it strikes (=FILE): "
                              f"{', '.join(ROT_MODES)}")
        if os.path.isabs(file) or file.split(os.sep)[0] == ".." or os.path.normpath(file) != file:
            raise ConfigError(f"malformed --point {text!r}: the file {file!r} must be a plain path relative to "
                              "{out} and inside it")
    return Point(int(rank), mode, op=int(op), state=None if state is None else int(state),
                 at_step=None if at_step is None else int(at_step), path=file, file=file)


def replay_point(entry: dict[str, Any]) -> str:
    """What ``--point`` takes to rerun a results entry of a job run: its recorded replay point
    (``scenario.point``, the id with its anchor), or its ``id`` in results written before anchors.
    Called by ``cli_job.replay_argv`` (``chaos replay``) and ``repro.find`` (``chaos repro``)."""
    scenario = entry.get("scenario")
    point = scenario.get("point") if isinstance(scenario, dict) else None
    return point if isinstance(point, str) and point.partition("@")[0] == entry.get("id") else str(entry.get("id"))


def _parse_anchor(text: str, anchor: str) -> dict[str, Any]:
    """``KIND:PATH:N`` of a ``--point`` (PATH relative to {out}, N >= 1) as Point fields; ConfigError if not."""
    kind, colon, rest = anchor.partition(":")
    path, colon2, nth = rest.rpartition(":")
    if not (colon and colon2 and re.fullmatch(r"[a-z_]+", kind) and path and nth.isdigit() and int(nth) >= 1):
        raise ConfigError(f"malformed --point {text!r}: an anchor is @KIND:PATH:N (an event kind such as write, "
                          "a path relative to {out}, and which such event on it, from 1)")
    if os.path.isabs(path) or path.split(os.sep)[0] == "..":
        raise ConfigError(f"malformed --point {text!r}: the anchor's path {path!r} must be relative to {{out}} "
                          "and inside it")
    return {"kind": kind, "path": path, "nth": int(nth)}


def _parse_node_point(text: str) -> Point:
    """``node1:step3:loss`` | ``node0:step3:rdzv`` | ``node1:step3:link``. The announcing rank is
    filled in by ``Reference.lookup`` from the fault-free run (-1 until then)."""
    m = _NODE_POINT.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"malformed --point {text!r}: expected nodeI:stepN:MODE, MODE one of "
                          f"{', '.join(NODE_MODES)}")
    node, step, mode = int(m.group(1)), int(m.group(2)), m.group(3)
    if mode == "loss" and node == 0:
        raise ConfigError(f"--point {text}: node 0 hosts the rendezvous; its loss is node0:step{step}:rdzv")
    if mode == "rdzv" and node != 0:
        raise ConfigError(f"--point {text}: the rendezvous host is node 0 (node0:step{step}:rdzv)")
    return Point(-1, mode, step=step, node=node)


def _read_fault(text: str) -> Fault:
    """``KIND:key=value,...``; every error names the offending text."""
    kind, _, rest = text.strip().partition(":")
    spec = FAULT_KINDS.get(kind)
    if spec is None:
        known = ", ".join(sorted(FAULT_KINDS))
        raise ConfigError(f"unknown fault kind {kind!r} in {text!r}: known kinds are {known}")
    allowed = COMMON_KEYS | spec.keys
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or not key or not raw:
            raise ConfigError(f"malformed fault {text!r}: expected key=value, got {item!r}")
        if key not in allowed:
            raise ConfigError(f"fault {text!r}: {kind} takes {', '.join(sorted(allowed))}, not {key!r}")
        if key in values:
            raise ConfigError(f"fault {text!r}: {key!r} given twice")
        values[key] = _parse_value(raw)
    for key in ("rank", "step", "attempt", "nth", "byte", "keep", "bits", "free", "length", "seed", "max_states",
                "offset"):
        if key in values and (not isinstance(values[key], int) or values[key] < 0):
            raise ConfigError(f"fault {text!r}: {key} must be a non-negative integer")
    if "at" in values and not (isinstance(values["at"], int | float) and 0 <= values["at"] <= 1):
        raise ConfigError(f"fault {text!r}: at must be a fraction of the file's length in [0, 1]")
    if kind == "payload":
        from faults.payload import FORMATS, HEADER_VARIANTS

        if values.get("format", "pickle") not in FORMATS:
            raise ConfigError(f"fault {text!r}: format must be one of {', '.join(FORMATS)}")
        if values.get("variant", HEADER_VARIANTS[0]) not in HEADER_VARIANTS:
            raise ConfigError(f"fault {text!r}: variant must be one of {', '.join(HEADER_VARIANTS)}")
    if spec.needs_step and "step" not in values:
        raise ConfigError(f"fault {text!r}: {kind} needs step=N (the step at which it fires)")
    if spec.needs_rank and "rank" not in values:
        raise ConfigError(f"fault {text!r}: {kind} needs rank=R")
    if spec.family == "io" and not {"op", "byte", "phase", "path"} & set(values):
        raise ConfigError(f"fault {text!r}: {kind} needs a point: op=KIND[,nth=N], byte=X[,path=GLOB] or phase=NAME")
    params = tuple(sorted((k, v) for k, v in values.items() if k not in COMMON_KEYS))
    return Fault(kind, values.get("rank"), values.get("step"), values.get("attempt", 0), params)


# ---------------------------------------------------------------------- one grammar, both targets
_PROCESS = ("kill", "term", "stop", "restart")
_IO = ("crash", "eio", "enospc", "fsyncfail", "shortwrite", "slowio")
_REST = ("truncate", "bitflip", "zero", "delete", "stale", "swap", "payload")
_PLACE = re.compile(r"(rank\d+|node\d+|disk|ckpt|all):")
_KEYVALUE = re.compile(r"[a-z]+(:|$)")  # KIND:key=value (a built-in fault's older spelling), or KIND alone
_JOB_KINDS = {"kill": "kill", "term": "term", "netdrop": "net", "stop": "stop", "restart": "restart"}  # what a job takes in the older spelling
# the one setting a job's point takes: a step kill, hang or network cut at a named phase of the save
# (chaos.phases), where the checkpointer announces it
_PHASE_NAME = re.compile(r"[A-Za-z_][\w.-]*")
PHASE_MODES = ("kill", "stop", "net", "restart")
_PHASE_POINT = re.compile(rf"rank(\d+):step(\d+):({'|'.join(PHASE_MODES)}),phase=({_PHASE_NAME.pattern})")
_POINT_FORMS = ("rankR:opN:MODE, rankR:stepN:kill|term|net|stop|restart (or kill:rank=R,step=N, term:rank=R,step=N, "
                "netdrop:rank=R,step=N, stop:rank=R,step=N, restart:rank=R,step=N), disk:full:BYTES or "
                "nodeN:stepS:MODE")


def parse_fault(text: str) -> Fault:
    """A built-in workload's fault in either spelling: ``rank1:step11:kill,phase=vote`` or
    ``kill:rank=1,step=11,phase=vote`` (the same :class:`Fault`)."""
    stripped = text.strip()
    if _PLACE.match(stripped):
        return _read_fault(_as_keyvalue(stripped, text))
    return _read_fault(text)


def _as_keyvalue(place: str, text: str) -> str:
    """``WHO:WHERE:WHAT[,k=v...]`` as the built-in fault's ``KIND:k=v,...``; ConfigError if not one."""
    head, comma, settings = place.partition(",")
    parts = head.split(":")
    who, what = parts[0], parts[-1]
    where = parts[1] if len(parts) == 3 else None
    if len(parts) not in (2, 3) or "@" in place:
        raise ConfigError(f"malformed --fault {text!r}: expected WHO:stepS:WHAT[,KEY=VALUE...] "
                          "(rank1:step11:kill) or KIND:key=value (kill:rank=1,step=11)")
    if (who, where) == ("disk", "full"):
        raise ConfigError(f"--fault {text!r}: disk:full:BYTES is a job's point (its {{out}} on a tmpfs of BYTES); the "
                          "built-in workload's full disk is disk:stepS:full,free=BYTES")
    if where is not None and not re.fullmatch(r"step\d+", where):
        raise ConfigError(f"--fault {text!r}: {where!r} is a place in a job's trace (a job's point: --point ... "
                          "-- COMMAND); a built-in fault fires at a step (stepS) or, for an I/O fault, where its "
                          "keys say (rank0:crash,op=write,nth=3)")
    keys: list[str] = []
    if who.startswith("rank"):
        keys.append(f"rank={who[4:]}")
        kind = "netdrop" if what == "net" else what
        if kind not in (*_PROCESS, *_IO, "netdrop"):
            raise ConfigError(f"--fault {text!r}: a rank's fault is one of {', '.join((*_PROCESS, 'net', *_IO))}")
    elif who == "ckpt":
        kind = what
        if kind not in _REST:
            raise ConfigError(f"--fault {text!r}: the newest checkpoint's fault is one of {', '.join(_REST)}")
    elif (who, what) in (("disk", "full"), ("all", "power")):
        kind = "diskfull" if who == "disk" else "powerloss"
    else:
        raise ConfigError(f"--fault {text!r}: {who}:...:{what} is no fault of the built-in workload "
                          "(disk:stepS:full, all:stepS:power, ckpt:stepS:KIND or rankR:stepS:KIND)")
    if where is None and kind not in _IO:
        raise ConfigError(f"--fault {text!r}: {kind} fires at a step: {who}:stepS:{what}")
    if where is not None:
        keys.append(f"step={where[4:]}")
    return f"{kind}:{','.join(k for k in (*keys, settings) if k)}"


def _io_point(text: str) -> Point | None:
    """A built-in workload's I/O fault as a job's point (``rank0:step4:crash,op=write,nth=1``,
    ``eio:rank=0,op=fsync``): the job's tracer fires the very rule the built-in rank would
    (``Fault.io_rule``), and its resume may take a second fault as any kill's
    (``...+rank0:op4:before``). None where ``text`` is no I/O fault."""
    head = text.partition(",")[0].partition("+")[0]
    parts = head.split(":")
    if _PLACE.match(text) and len(parts) == 3 and not re.fullmatch(r"step\d+", parts[1]):
        return None  # a place in the job's trace: rank0:op3:eio is the job's own errno point
    what = parts[-1] if _PLACE.match(text) else parts[0]
    if what not in _IO:
        return None
    then = _THEN.search(text)
    fault = parse_fault(text[:then.start()] if then else text)
    if fault.attempt:
        raise ConfigError(f"--point {text!r}: a job's I/O fault fires in the first attempt; attempt= is the "
                          "built-in workload's")
    try:
        rule = fault.io_rule()
    except ConfigError as exc:
        raise ConfigError(f"--point {text!r}: {exc}") from None
    point = Point(fault.rank, fault.kind, builtin=fault.spec(), rule=tuple(sorted(rule.items())))
    if then is None:
        return point
    if point.family not in THEN_FAMILIES:
        raise ConfigError(f"--point {text!r}: a second fault (+rankR:opN:MODE) follows a point of "
                          f"{', '.join(THEN_FAMILIES)}, not of {point.family}")
    return dataclasses.replace(point, then=Point(int(then.group(1)), then.group(3), op=int(then.group(2)), attempt=1))


def _save_power_point(text: str) -> Point | None:
    """The built-in ``all:stepS:power[,max_states=K][,seed=N]`` (``powerloss:step=S,...``) as a job's
    stand-in for the power cuts of the whole save at step S (``Point.whole_save``); None where
    ``text`` is not that fault."""
    if not (text.startswith("all:") or text.startswith("powerloss:")):
        return None
    if "+rank" in text:
        raise ConfigError(f"--point {text!r}: the power cuts of a whole save take no second fault (+rankR:opN:MODE)")
    fault = parse_fault(text)
    if fault.kind != "powerloss":
        return None
    if fault.attempt or fault.rank is not None:
        raise ConfigError(f"--point {text!r}: a job's power cuts of a save are all:stepS:power[,max_states=K,seed=N]; "
                          "rank= and attempt= are the built-in workload's")
    return Point(0, "power", step=fault.step, builtin=fault.spec())


def _rest_point(text: str) -> Point | None:
    """The built-in ``ckpt:stepS:KIND[,settings]`` (``KIND:step=S,...``: a file of the newest checkpoint
    struck at rest) as a job's point: every copy halts when rank 0 announces step S
    (``chaos.nemesis.newest``); None where ``text`` is not that fault."""
    head = text.partition(",")[0]
    if not (head.startswith("ckpt:") or head.partition(":")[0] in _REST and "=" in text.partition(":")[2]):
        return None
    if "+rank" in text:
        raise ConfigError(f"--point {text!r}: a fault of the newest checkpoint takes no second fault "
                          "(+rankR:opN:MODE)")
    fault = parse_fault(text)
    if fault.attempt:
        raise ConfigError(f"--point {text!r}: a job's checkpoint is struck in the first attempt; attempt= is the "
                          "built-in workload's")
    return Point(0, fault.kind, at_step=fault.step, builtin=fault.spec(), settings=fault.params)


def _disk_step_point(text: str) -> Point | None:
    """The built-in ``disk:stepS:full,free=B`` (``diskfull:step=S,free=B``) as a job's point: {out}'s
    tmpfs filled up when rank 0 announces step S, leaving B bytes; None where ``text`` is not that fault."""
    if not (text.startswith("disk:step") or text.startswith("diskfull:")):
        return None
    if "+rank" in text:
        raise ConfigError(f"--point {text!r}: a full disk takes no second fault (+rankR:opN:MODE)")
    fault = parse_fault(text)
    if fault.attempt:
        raise ConfigError(f"--point {text!r}: a job's disk fills in the first attempt; attempt= is the built-in "
                          "workload's")
    return Point(0, "diskfull", step=fault.step, size=int(fault.param("free", 0)), builtin=fault.spec())


def parse_point(text: str) -> Point:
    """A job's point in the grammar (``rank0:op17:before``, ``rank0:step5:kill``, ...), a step
    kill, SIGTERM or network cut in the built-in fault's spelling (``kill:rank=0,step=5``), or a
    built-in I/O fault in either spelling (:func:`_io_point`), or the power cuts of a whole save
    (``all:step8:power``, :func:`_save_power_point`), or a disk filled at a step
    (``disk:step8:full,free=4096``, :func:`_disk_step_point`), or a file of the newest checkpoint struck
    at rest (``ckpt:step8:bitflip,bits=2``, :func:`_rest_point`)."""
    stripped = text.strip()
    if (io := _io_point(stripped)) is not None:
        return io
    if (save := _save_power_point(stripped)) is not None:
        return save
    if (disk := _disk_step_point(stripped)) is not None:
        return disk
    if (rest := _rest_point(stripped)) is not None:
        return rest
    if _PLACE.match(stripped) or not _KEYVALUE.match(stripped):
        one = _THEN.sub("", stripped)  # (a second fault takes no setting either)
        if "," in one.partition("@")[0] and _PLACE.match(one) and not _PHASE_POINT.fullmatch(one):
            if one == stripped and _STEP_PROCESS.match(one):  # a kill, SIGTERM, hang or cut with its own settings
                return _process_point(parse_fault(one), text)
            raise ConfigError(f"--point {text!r}: a job's point takes no KEY=VALUE settings (a SIGTERM's grace is "
                              "--grace, a cut's length --net-hold); settings are for a built-in fault (--fault)")
        return _read_point(text)
    kind = stripped.partition(":")[0]
    if kind in FAULT_KINDS and kind not in _JOB_KINDS:
        raise ConfigError(f"--point {text!r}: {kind} is a fault of the built-in workload (--fault); a job's points "
                          f"are {_POINT_FORMS}")
    if kind not in _JOB_KINDS:
        raise ConfigError(f"malformed --point {text!r}: expected {_POINT_FORMS}")
    return _process_point(_read_fault(stripped), text)


# the settings a job's step kill, SIGTERM, hang or cut takes from the built-in fault: a phase of the
# save; a SIGTERM's own grace (--grace for the others); how long the other copies run on once the
# struck one is gone before the launcher stops them (linger, a launcher's monitor interval); a kill's
# rank lost for good (lost=true: the restarts run on one rank fewer, chaos.nemesis.shrink)
_PROCESS_SETTINGS = {"kill": {"phase", "linger", "lost"}, "term": {"grace", "linger"}, "stop": {"phase", "linger"},
                     "restart": {"phase", "timeout"},
                     "netdrop": {"phase"}}
_STEP_PROCESS = re.compile(r"rank\d+:step\d+:(kill|term|stop|net|restart),")


def _process_point(fault: Fault, text: str) -> Point:
    """A step kill, SIGTERM, hang or network cut read as a built-in fault (``kill:rank=1,step=5,linger=3``,
    ``rank0:step5:term,grace=2``) as a job's point: with settings beyond a phase it keeps the fault as
    written (``Point.builtin``) and its settings, which the launcher honours (``Point.grace_s``,
    ``Point.linger_s``)."""
    kind = fault.kind
    if kind not in _PROCESS_SETTINGS:
        raise ConfigError(f"--point {text!r}: {kind} is a fault of the built-in workload (--fault); a job's points "
                          f"are {_POINT_FORMS}")
    keys = {k for k, _v in fault.params}
    if keys - _PROCESS_SETTINGS[kind] or fault.attempt or fault.rank is None or fault.step is None:
        raise ConfigError(f"--point {text!r}: a job's {kind} is {kind}:rank=R,step=N (rankR:stepN:{_JOB_KINDS[kind]}) "
                          f"with at most {', '.join(sorted(_PROCESS_SETTINGS[kind]))}; other settings are the "
                          "built-in workload's")
    phase = fault.param("phase")
    if phase is not None and not _PHASE_NAME.fullmatch(str(phase)):
        raise ConfigError(f"--point {text!r}: phase={phase!r} is no phase name (letters, digits, _ . -)")
    settings = tuple((k, v) for k, v in fault.params if k != "phase" and not (k == "lost" and v is False))
    for key, value in settings:
        if key == "lost":
            if value is not True:
                raise ConfigError(f"--point {text!r}: lost must be true or false, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"--point {text!r}: {key} must be a number of seconds, at least 0")
    return Point(fault.rank, _JOB_KINDS[kind], step=fault.step, phase=None if phase is None else str(phase),
                 builtin=fault.spec() if settings else None, settings=settings)

