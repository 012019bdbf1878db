"""Inside a job's interpreter: a zygote that forks the attempts of one exploration.

Why: a point of a torch or Lightning job costs at least one interpreter that imports torch
and the framework (2-4 s of CPU on these machines), and the job's own work after the fault is
often a fraction of that. Spares (``chaos.launch.spares``) hide the start-up behind the
running attempt, but on two cores the import still competes with it. A zygote imports the
modules once (``CHAOS_JOB_PRELOAD``, as a spare does before its gate) and then forks each
attempt, as the built-in workload's fork server forks ranks: the attempt starts with the
modules loaded, and the import is paid once per exploration.

Called by the boot path (``boot/sitecustomize.py``) when ``CHAOS_JOB_ZYGOTE`` names the fd
of a ``SOCK_SEQPACKET`` socket to the harness (``chaos.launch.zygote`` starts it): after the
preload and before the gate, :func:`serve` never returns in the zygote itself; it returns in
each forked child, which then goes on booting as the attempt (the tracer installed from the
attempt's environment, then the job's ``__main__``). Messages, one JSON object each:

    zygote -> harness   {"ready": true, "pid": P, "head": N, "threads": T}   once, after the preload
    harness -> zygote   {"args": [...], "env": {...}, "cwd": "...", "log": "..."}   fork one attempt
    zygote -> harness   {"pid": C} | {"error": "..."}                        the answer to it
    zygote -> harness   {"exit": C, "code": RC}                              whenever a child ended

Before it says ready, a zygote started for a job that had changed environment variables by its
first file event (``CHAOS_JOB_ZYGOTE_ENV``: name -> value) checks that its preload left each one
so, and otherwise says why not (``"ready": false``): the job then starts fresh interpreters.
Whatever the preload changed in the environment (``/proc/self/environ`` against ``os.environ``)
each child changes on top of its attempt's environment, as the same imports would have in a
fresh interpreter.

``head`` is how many words of the zygote's own command line come before its ``sys.argv[1:]``
(the interpreter, its options, the script or ``-m module``): the harness forks only attempts
whose command line has the same head, and ``args`` replace ``sys.argv[1:]``. ``RC`` is a
``subprocess`` return code (negative: the signal). The child, before it goes on: its own
session (as ``start_new_session``), the attempt's working directory, stdout and stderr on the
attempt's log, ``os.environ`` exactly the attempt's (the C environment too), ``sys.argv``,
``tempfile``'s cached temp dir the attempt's ``TMPDIR``, numpy's global
generator seeded afresh as a new interpreter's would be (``random`` reseeds itself at fork).
End of file on the socket (the harness closed it or died) ends the zygote; its children
are the harness's to kill (each is a session leader, tracked by its pid).
"""

import json
import os
import select
import socket
import sys

_GONE = ("CHAOS_JOB_GATE", "CHAOS_JOB_PRELOAD", "CHAOS_JOB_ZYGOTE", "CHAOS_JOB_ZYGOTE_ENV")  # the boot path's, never the job's


def _head() -> int:
    """Words of this process's command line before ``sys.argv[1:]`` (``/proc/self/cmdline``)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return -1
    if words and words[-1] == b"":
        words.pop()
    return len(words) - (len(sys.argv) - 1)


def _preload_changes() -> dict:
    """What importing the preloaded modules did to the environment (name -> value, None: unset),
    against the environment this process was started with (``/proc/self/environ``); the boot
    path's own variables aside. A fresh interpreter's imports make the same changes, so each
    forked child makes them on top of its attempt's environment (Lightning sets
    ``PYTORCH_NVML_BASED_CUDA_CHECK`` as it loads)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    except OSError:
        return {}
    start = {os.fsdecode(k): os.fsdecode(v) for k, v in pairs}
    keys = {k for k in set(start) | set(os.environ) if not k.startswith("CHAOS_JOB_")}
    return {k: os.environ.get(k) for k in keys if start.get(k) != os.environ.get(k)}


def _become(req: dict, ready_w: int, changes: dict) -> None:
    """In the forked child: turn into the attempt ``req`` describes, then say so on ``ready_w``."""
    os.setsid()
    os.chdir(req["cwd"])
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    env = {k: v for k, v in req["env"].items() if k not in _GONE}
    for k, v in changes.items():  # what the preloaded imports did, as they would have in a fresh interpreter
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    os.environ.clear()  # putenv/unsetenv too: C code reading getenv sees the attempt's environment
    os.environ.update(env)
    sys.argv[1:] = list(req["args"])
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None and tempfile.tempdir is not None:
        # The preload asked already, and the fault-free run's probe of the temp dir (a file written
        # and removed there) is among the events this attempt skips: take the attempt's TMPDIR as
        # it is (the boot path moves it to the rank's own folder), or find it afresh without one.
        given = os.environ.get("TMPDIR")
        tempfile.tempdir = os.path.abspath(given) if given else None
    npr = sys.modules.get("numpy.random")  # numpy imports it lazily: only if a preloaded module did
    if npr is not None:
        try:
            npr.seed()
        except Exception:  # noqa: BLE001, S110 - an odd numpy: its state stays the zygote's
            pass
    os.write(ready_w, b"k")
    os.close(ready_w)


def _send(sock: socket.socket, obj: dict) -> None:
    try:
        sock.send(json.dumps(obj).encode())
    except OSError:
        os._exit(0)  # the harness is gone: nothing to serve


def serve(fd: int) -> None:
    """Fork attempts on request; returns only in a forked child (see the module docstring)."""
    import threading

    sock = socket.socket(fileno=fd)
    sys.stdout.flush()
    sys.stderr.flush()
    if not hasattr(os, "pidfd_open"):  # Python < 3.9: no way to wait on children and the socket at once
        _send(sock, {"ready": False, "why": "this Python has no os.pidfd_open"})
        os._exit(0)
    want = json.loads(os.environ.pop("CHAOS_JOB_ZYGOTE_ENV", None) or "{}")
    off = [k for k, v in want.items() if os.environ.get(k) != v]
    if off:  # the job had set these by its first file event, and the preload alone did not
        _send(sock, {"ready": False, "why": f"importing the modules did not set {', '.join(sorted(off)[:5])} as the "
                                             "job had by its first file event"})
        os._exit(0)
    changes = _preload_changes()
    _send(sock, {"ready": True, "pid": os.getpid(), "head": _head(), "threads": threading.active_count()})
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        readable, _, _ = select.select([sock, *children], [], [])
        for pfd in [r for r in readable if r is not sock]:
            pid = children.pop(pfd)
            os.close(pfd)
            _pid, status = os.waitpid(pid, 0)
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock not in readable:
            continue
        try:
            msg = sock.recv(1 << 22)
        except OSError:
            msg = b""
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            sock.close()
            for pfd in children:
                os.close(pfd)
            try:
                _become(req, ready_w, changes)
            except BaseException as exc:  # noqa: BLE001 - say why, and leave no half-made attempt
                try:
                    os.write(ready_w, f"e{type(exc).__name__}: {exc}".encode()[:500])
                finally:
                    os._exit(127)
            return
        os.close(ready_w)
        answer = b""
        while True:
            chunk = os.read(ready_r, 512)
            if not chunk:
                break
            answer += chunk
        os.close(ready_r)
        if answer == b"k":
            children[os.pidfd_open(pid)] = pid
            _send(sock, {"pid": pid})
        else:
            os.waitpid(pid, 0)
            _send(sock, {"error": answer[1:].decode(errors="replace") or "the forked attempt died at once"})
