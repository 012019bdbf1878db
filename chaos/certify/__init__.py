"""``chaos certify``: evidence that a storage backend keeps checkpoints safe.

Three parts, each with a verdict and its evidence:

1. the conformance battery (:mod:`chaos.certify.battery`): storage properties the
   reference checkpointer's commit protocol relies on, checked against the real backend;
2. a chaos campaign: real 2-rank training jobs with the reference checkpointer on that
   backend, faulted (a kill in the middle of a save; on file systems also at-rest
   corruption and power loss) and judged by the harness's oracles through the normal
   runner (:func:`chaos.run.runner.run_scenario`);
3. measured save and load throughput on the backend.

The backend is *certified* only when no property fails (``n/a`` needs a reason), every
campaign scenario passes and the run was whole. A campaign scenario whose fault did
nothing (*skipped*: a bit flip the reader never saw) tested nothing: the verdict is then
``NOT TESTED`` with the scenario named, never a certification and never a refusal, so
one run's luck cannot flip the answer. Partial runs: ``--only``, ``--no-campaign`` and
``--quick`` (which skips the bit-flip and power-loss scenarios) are partial runs, never
certified (exit 1, with the reason). The report is JSON (and HTML via ``reports.html``).

Where it writes: only under the backend's own ``certify-<id>`` location and one private
scratch directory (``--scratch`` or the system temp dir), both removed at the end. The
golden runs the campaign compares against are cached inside that scratch directory too
(so nothing lands in ``~/.cache``) unless a cache directory is given explicitly, and
while certify runs, :mod:`tempfile` hands out temp dirs inside the scratch directory.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaos.scratch import make_root

SCHEMA_VERSION = 1


def campaign_scenarios(target: Any, quick: bool = False) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(name, faults, extra ckpt options) of the chaos campaign for this backend."""
    out = [("kill mid-save (rank 1 SIGKILLed while writing its shard), restart, bit-exact resume",
            ["kill:rank=1,phase=write_shards,step=15"], {})]
    if target.kind == "posix" and not quick:
        out.append(("bit flip in the newest checkpoint: detected or fell back, never silent",
                    ["bitflip:step=17,bits=16,region=data,seed=0"], {}))
        out.append(("power loss during a save: every crash state loads one committed state",
                    ["powerloss:step=15,seed=0,max_states=30"], {}))
    return out


def run_campaign(target: Any, scratch: str, seed: int = 0, quick: bool = False, steps: int = 20,
                 progress: Callable[[str], None] | None = None, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Each scenario through the normal runner, with the checkpoint root on the backend.

    Golden runs are cached in ``cache_dir``, by default inside ``scratch`` (removed with it).
    """
    from chaos.model.grammar import parse_fault
    from chaos.plan.scenario import Scenario
    from chaos.run.runner import RunOptions, run_scenario
    from chaos.target.workload.config import WorkloadConfig

    results = []
    for i, (name, faults, extra) in enumerate(campaign_scenarios(target, quick)):
        if progress:
            progress(f"campaign: {name}")
        opts: dict[str, Any] = dict(extra)
        if target.wrapper:
            opts["storage_wrapper"] = target.wrapper
        if target.kind == "posix":
            # The scenario's whole scratch root (and so its checkpoint root) lives on the
            # file system under test: at-rest corruption and power loss act on it directly.
            base = target.url(f"campaign-{i}")[len("file://"):]
        else:
            opts["storage"] = target.url(f"campaign-{i}")
            base = tempfile.mkdtemp(prefix="campaign-", dir=scratch)
        run_opts = RunOptions(scratch_base=base, cache_dir=Path(cache_dir or os.path.join(scratch, "golden")))
        sc = Scenario("reference", world_size=2, workload=WorkloadConfig(steps=steps, save_every=5, seed=seed),
                      faults=[parse_fault(f) for f in faults], ckpt_options=opts, backend=target.kind)
        t = time.perf_counter()
        r = run_scenario(sc, run_opts)
        results.append({
            "name": name, "faults": faults, "verdict": r.verdict, "error": r.error,
            "seconds": round(time.perf_counter() - t, 2),
            "oracles": {n: {"passed": o.passed, "summary": o.summary} for n, o in r.oracles.items()},
            "replay": r.replay,
        })
    return results


def measure_throughput(target: Any, scratch: str, mib: int = 64, repeats: int = 2) -> dict[str, Any]:
    """Save and verified-load MB/s of the reference checkpointer (one rank) on the backend.

    A save or load that fails here (a mount that answers EIO right after a rename) is no
    speed at all: the result is ``{"bytes", "error"}`` and :func:`decide` refuses the
    backend for it, as it would for a failing property.
    """
    from chaos.certify.harness import Bench, error_text, make_state

    b = Bench(target, scratch)
    st = make_state(1, mib << 20)
    nbytes = sum(t.numel() * t.element_size() for t in (st["model"]["w"], st["model"]["b"]))
    c = b.ckpt("throughput")
    saves, loads = [], []
    try:
        for i in range(repeats):
            t = time.perf_counter()
            c.save(i + 1, st)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = c.load_latest(st)
            loads.append(time.perf_counter() - t)
            if got is None or got[0] != i + 1:
                return {"bytes": nbytes, "error": f"the load right after saving step {i + 1} found "
                        f"{'nothing' if got is None else f'step {got[0]}'}"}
    except Exception as exc:  # noqa: BLE001 - the backend's failure is the finding; it refuses the backend
        return {"bytes": nbytes, "error": error_text(exc, 400)}
    finally:
        c.close()
    best_s, best_l = min(saves), min(loads)
    return {"bytes": nbytes, "save_seconds": [round(x, 4) for x in saves], "load_seconds": [round(x, 4) for x in loads],
            "save_mb_s": round(nbytes / best_s / 1e6, 1), "load_mb_s": round(nbytes / best_l / 1e6, 1),
            "note": "best of the repeats; load includes checksum verification"}


PARTIAL_FLAGS = (("only", "--only"), ("no_campaign", "--no-campaign"), ("quick", "--quick: no bit-flip or power-loss scenarios"))


def certify(spec: str, wrapper: str | None = None, seed: int = 0, campaign: bool = True, quick: bool = False,
            throughput_mib: int = 64, only: list[str] | None = None, scratch_base: str | None = None,
            progress: Callable[[str], None] | None = None, dcp: bool = False,
            cache_dir: str | None = None, remount: list[str] | None = None) -> dict[str, Any]:
    """Run the whole certification; returns the report dict (see module docstring).

    Everything is written under the backend's own ``certify-<id>`` location and a private
    scratch dir (under ``scratch_base``, else the system temp dir), both removed at the
    end; golden runs are cached in that scratch dir unless ``cache_dir`` is given; an
    embedded S3 server is stopped even on error. A partial run (``only``, no campaign,
    ``quick``) is never certified. ``remount``: how ``client_crash`` mounts a FUSE backend
    again after killing its daemon (default: the daemon's own command line).
    """
    import torch

    from chaos.certify.battery import run_battery
    from chaos.certify.harness import verdict_dict
    from chaos.certify.target import resolve

    torch.set_num_threads(1)  # the battery forks; keep OpenMP out of the parent
    started = time.time()
    target = resolve(spec, wrapper)  # bad input fails here, before anything is created
    target.remount = remount
    mount = target.mount()  # before the run: client_crash restarts a FUSE daemon
    note = progress or (lambda msg: None)
    cleanup_error = None
    try:
        with _scratch_dir(scratch_base) as scratch:
            try:
                from chaos.reference.storage import open_storage, wrap_storage

                probe = wrap_storage(open_storage(target.url("probe"), local_dir=scratch), wrapper)
                protocol = probe.commit_protocol
                probe.close()
                props = run_battery(target, scratch, seed, only, progress=lambda n: note(f"property: {n}"))
                scenarios = run_campaign(target, scratch, seed, quick, progress=note, cache_dir=cache_dir) if campaign else []
                note("throughput")
                throughput = measure_throughput(target, scratch, throughput_mib) if throughput_mib else None
                dcp_report = None
                if dcp:
                    note("DCP FsspecWriter")
                    from chaos.certify.dcp_fsspec import certify_dcp

                    dcp_report = certify_dcp(target, scratch)
            finally:
                cleanup_error = _remove_run(target)
    finally:
        if target.local_s3 is not None:
            target.local_s3.stop()
    given = {"only": bool(only), "no_campaign": not campaign, "quick": bool(quick and campaign)}
    verdict, failing, not_tested, partial = decide([(p.name, p.status) for p in props], scenarios, cleanup_error,
                                                   [flag for key, flag in PARTIAL_FLAGS if given[key]],
                                                   (throughput or {}).get("error"))
    certified = verdict == "CERTIFIED"
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "certification",
        "backend": spec,
        "backend_kind": target.kind,
        "mount": mount,
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "wrapper": wrapper,
        "commit_protocol": protocol,
        "checkpointer": "reference",
        "certified": certified,
        "verdict": verdict,
        "failing": failing,
        "not_tested": not_tested,
        "partial": f"partial run ({'; '.join(partial)}): never certified" if partial else None,
        "cleanup_error": cleanup_error,
        "properties": [verdict_dict(p) for p in props],
        "campaign": scenarios,
        "campaign_run": campaign,
        "throughput": throughput,
        "dcp": dcp_report,
        "seed": seed,
        "seconds": round(time.time() - started, 1),
        "host": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()},
    }


def decide(props: list[tuple[str, str]], scenarios: list[dict[str, Any]], cleanup_error: str | None,
           partial: list[str], throughput_error: str | None = None) -> tuple[str, list[str], list[str], list[str]]:
    """(verdict, failing, not tested, partial) of a certification: CERTIFIED, NOT CERTIFIED or NOT TESTED.

    A property that fails, a campaign scenario that fails or errs, a throughput measurement
    whose save or verified load failed, or a clean-up that left something refuses the backend. A scenario whose fault did nothing (*skipped*) tested
    nothing: never a reason to certify, nor to refuse; with nothing failing the verdict is
    NOT TESTED, naming it. A partial run is never certified.
    """
    failing = [name for name, status in props if status == "fail"]
    failing += [f"campaign: {s['name']}" for s in scenarios if s["verdict"] not in ("pass", "skipped")]
    if throughput_error:
        failing.append("throughput")
    if cleanup_error:
        failing.append("cleanup")
    not_tested = [f"campaign: {s['name']}: {s.get('error') or 'skipped'}" for s in scenarios
                  if s["verdict"] == "skipped"]
    verdict = ("NOT CERTIFIED" if failing else "NOT TESTED" if not_tested else
               "NOT CERTIFIED" if partial else "CERTIFIED")
    return verdict, failing, not_tested, partial


@contextlib.contextmanager
def _scratch_dir(parent: str | None) -> Iterator[str]:
    """certify's one private scratch directory, and this process's temp dir while it runs.

    Local checkpointer roots, campaign scratch roots and the golden cache are put there
    explicitly; ``TMPDIR`` and :data:`tempfile.tempdir` point at ``<scratch>/tmp`` so
    whatever else asks for a temp dir meanwhile — the fork server this starts (torch's
    ``torchinductor_<user>`` dir at its import), libraries — lands inside too. The
    temp dir of :mod:`multiprocessing` is made first, where it was, because it lives until
    this process exits (``chaos.launch.cluster.own_mp_temp_dir``: a claimed root, removed
    then, or by ``chaos clean`` after a SIGKILL).
    """
    from chaos.launch.cluster import own_mp_temp_dir

    own_mp_temp_dir()
    scratch = make_root("chaos-certify-", parent)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    tmp = os.path.join(scratch, "tmp")
    try:
        os.mkdir(tmp)
        os.environ["TMPDIR"] = tempfile.tempdir = tmp
        yield scratch
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(scratch, ignore_errors=True)


def _remove_run(target: Any) -> str | None:
    """Delete this run's location on the backend; the error, when that failed (never silent)."""
    from chaos.certify.harness import error_text

    try:
        target.remove_run()
    except Exception as exc:  # noqa: BLE001 - reported in the report and the verdict, never swallowed
        return f"could not remove {target.url('')}: {error_text(exc, 300)}"
    return None
