"""Boot path of ``chaos run -- COMMAND``: the harness puts this directory first on PYTHONPATH.

Python imports ``sitecustomize`` as every interpreter starts, before the job's own
code. Here that installs the in-rank I/O interposer (``chaos.target.job.inproc``) when the
harness's environment says this process is one of the job's ranks; in any other
process (no ``CHAOS_JOB_OUT``, torchrun's agent, a child of a traced rank) it does
nothing. Whatever ``sitecustomize`` this one shadows is then imported as usual, and a
failure here never stops the job: it is reported on stderr and the job runs untraced
(the judge then finds no trace and says so).
"""

import os
import sys


def _chain() -> None:
    """Import the sitecustomize this file shadows, if there is one further down sys.path."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    mod = sys.modules.pop("sitecustomize", None)
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        found = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if found is not None and found.loader is not None:
            other = importlib.util.module_from_spec(found)
            found.loader.exec_module(other)
    except Exception as exc:  # noqa: BLE001 - another package's start-up hook is not ours to crash
        print(f"chaos: the shadowed sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        if mod is not None:
            sys.modules["sitecustomize"] = mod


def _gate() -> None:
    """A spare started ahead of its attempt (``chaos/launch/spares.py``) waits here, before the
    tracer is installed and before any line of the job: it says it is ready, then blocks
    until the harness says go. Anything but "go" (the spare was dropped, the harness died)
    ends the process before the job could run at the wrong time."""
    gate = os.environ.pop("CHAOS_JOB_GATE", None)  # the job sees the environment a plain launch gives
    if not gate:
        return
    try:
        go, ready = (int(x) for x in gate.split(","))
        os.write(ready, b"r")
        os.close(ready)
        got = os.read(go, 1)
        os.close(go)
    except (OSError, ValueError):
        got = b""
    if got != b"g":
        os._exit(0)


def _preload(saved: tuple) -> None:
    """Import the modules the harness names (``CHAOS_JOB_PRELOAD``: what the fault-free run had
    imported by its first file event, ``chaos.run.explore``) before the gate, so a spare
    interpreter has torch and the like loaded while it waits and the job's own import of them
    is instant. Compiled as the job's imports are (``saved``: the interpreter's own bytecode
    settings); a module that fails here is left for the job to import, and to fail, itself."""
    names = os.environ.pop("CHAOS_JOB_PRELOAD", "")  # the job sees the environment a plain launch gives
    if not names:
        return
    import importlib

    mine = (sys.pycache_prefix, sys.dont_write_bytecode)
    sys.pycache_prefix, sys.dont_write_bytecode = saved
    try:
        for name in names.split(","):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - the job's own import will say what is wrong
                continue
    finally:
        sys.pycache_prefix, sys.dont_write_bytecode = mine


def _zygote() -> None:
    """A zygote (``chaos/launch/zygote.py`` starts it) forks each attempt of an exploration from
    here, its modules preloaded: the zygote itself never comes back from ``serve``, and each
    forked child goes on booting as its attempt (``chaos/target/job/zygote.py``)."""
    fd = os.environ.pop("CHAOS_JOB_ZYGOTE", None)
    if not fd:
        return
    try:
        from chaos.target.job.zygote import serve
    except Exception as exc:  # noqa: BLE001 - the harness reads end of file and starts attempts itself
        print(f"chaos: the zygote could not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(0)
    serve(int(fd))


def _boot() -> None:
    if not os.environ.get("CHAOS_JOB_OUT"):
        return
    # The tracer's own modules are compiled once per exploration into the harness's scratch
    # root (CHAOS_JOB_PYCACHE) and read from there by every later process: with
    # PYTHONDONTWRITEBYTECODE set (common in containers and CI) each rank would otherwise
    # recompile them, ~50-100 ms a process. Only these imports use the prefix; the job's
    # own imports keep the interpreter's settings.
    prefix = os.environ.get("CHAOS_JOB_PYCACHE")
    saved = (sys.pycache_prefix, sys.dont_write_bytecode)
    if prefix:
        sys.pycache_prefix, sys.dont_write_bytecode = prefix, False
    try:
        try:
            try:
                import chaos.target.job.inproc  # noqa: F401
            except ImportError:
                # A job run by another interpreter: make this project importable, last on the path.
                # (this file is <project>/chaos/target/job/boot/sitecustomize.py)
                sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                    os.path.abspath(__file__)))))))
            from chaos.target.job.inproc import install

            if "chaosio" in os.environ.get("LD_PRELOAD", ""):
                import chaos.target.job.native  # noqa: F401 - binding the native tracer: before the gate
        finally:
            _preload(saved)
            _zygote()  # a zygote forks attempts here: this returns only in each forked attempt
            _gate()  # a spare waits here even when the tracer failed to import
        install()
    except Exception as exc:  # noqa: BLE001 - never break the user's job; the judge sees no trace
        print(f"chaos: could not install the I/O tracer: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.pycache_prefix, sys.dont_write_bytecode = saved


_boot()
_chain()
