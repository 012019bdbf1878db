"""``chaos certify``: evidence that a storage backend keeps checkpoints safe.

Three parts, each with a verdict and its evidence:

1. the conformance battery (:mod:`chaos.certify.battery`): storage properties the
   reference checkpointer's commit protocol relies on, checked against the real backend;
2. a chaos campaign: real 2-rank training jobs with the reference checkpointer on that
   backend, faulted (a kill in the middle of a save; on file systems also at-rest
   corruption and power loss) and judged by the harness's oracles through the normal
   runner (:func:`chaos.runner.run_scenario`);
3. measured save and load throughput on the backend.

The backend is *certified* only when no property fails (``n/a`` needs a reason) and
every campaign scenario passes. The report is JSON (and HTML via ``reports.html``).
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

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
                 progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Each scenario through the normal runner, with the checkpoint root on the backend."""
    from chaos.runner import RunOptions, run_scenario
    from chaos.scenario import Scenario, parse_fault
    from chaos.workload.config import WorkloadConfig

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
            run_opts = RunOptions(scratch_base=base)
        else:
            opts["storage"] = target.url(f"campaign-{i}")
            run_opts = RunOptions(scratch_base=tempfile.mkdtemp(prefix="campaign-", dir=scratch))
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
    """Save and verified-load MB/s of the reference checkpointer (one rank) on the backend."""
    from chaos.certify.battery import Bench, make_state

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
            assert got is not None and got[0] == i + 1
    finally:
        c.close()
    best_s, best_l = min(saves), min(loads)
    return {"bytes": nbytes, "save_seconds": [round(x, 4) for x in saves], "load_seconds": [round(x, 4) for x in loads],
            "save_mb_s": round(nbytes / best_s / 1e6, 1), "load_mb_s": round(nbytes / best_l / 1e6, 1),
            "note": "best of the repeats; load includes checksum verification"}


def certify(spec: str, wrapper: str | None = None, seed: int = 0, campaign: bool = True, quick: bool = False,
            throughput_mib: int = 64, only: list[str] | None = None, scratch_base: str | None = None,
            progress: Callable[[str], None] | None = None, dcp: bool = False) -> dict[str, Any]:
    """Run the whole certification; returns the report dict (see module docstring).

    Everything is written under the backend's own ``certify-<id>`` location and a private
    scratch dir, both removed at the end; an embedded S3 server is stopped even on error.
    """
    import torch

    from chaos.certify.battery import run_battery
    from chaos.certify.target import resolve

    torch.set_num_threads(1)  # the battery forks; keep OpenMP out of the parent
    started = time.time()
    target = resolve(spec, wrapper)  # bad input fails here, before anything is created
    scratch = tempfile.mkdtemp(prefix="chaos-certify-", dir=scratch_base)
    note = progress or (lambda msg: None)
    try:
        from chaos.storage import open_storage, wrap_storage

        probe = wrap_storage(open_storage(target.url("probe"), local_dir=scratch), wrapper)
        protocol = probe.commit_protocol
        probe.close()
        props = run_battery(target, scratch, seed, only, progress=lambda n: note(f"property: {n}"))
        scenarios = run_campaign(target, scratch, seed, quick, progress=note) if campaign else []
        note("throughput")
        throughput = measure_throughput(target, scratch, throughput_mib) if throughput_mib else None
        dcp_report = None
        if dcp:
            note("DCP FsspecWriter")
            from chaos.certify.dcp_fsspec import certify_dcp

            dcp_report = certify_dcp(target, scratch)
    finally:
        if target.kind == "posix":
            shutil.rmtree(target.url("x")[len("file://"):].rsplit("/", 1)[0], ignore_errors=True)
        elif target.kind == "fsspec":
            _remove_fsspec_run(target)
        else:
            _remove_s3_run(target)
        if target.local_s3 is not None:
            target.local_s3.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    failing = [p.name for p in props if p.status == "fail"]
    failing += [f"campaign: {s['name']}" for s in scenarios if s["verdict"] not in ("pass",)]
    partial = not campaign or bool(only)
    certified = not failing and not partial
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "certification",
        "backend": spec,
        "backend_kind": target.kind,
        "wrapper": wrapper,
        "commit_protocol": protocol,
        "checkpointer": "reference",
        "certified": certified,
        "failing": failing,
        "partial": "partial run (--only or --no-campaign): never certified" if partial else None,
        "properties": [p.to_dict() for p in props],
        "campaign": scenarios,
        "campaign_run": campaign,
        "throughput": throughput,
        "dcp": dcp_report,
        "seed": seed,
        "seconds": round(time.time() - started, 1),
        "host": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()},
    }


def _remove_fsspec_run(target: Any) -> None:
    """Delete this run's directory on the fsspec filesystem (best effort)."""
    from chaos.storage import open_storage

    try:
        st = open_storage(target.url(""))
        run_dir = st.base.rstrip("/")
        if st.fs.exists(run_dir):
            st.fs.rm(run_dir, recursive=True)
        st.close()
    except Exception:  # noqa: BLE001 - best effort
        return


def _remove_s3_run(target: Any) -> None:
    """Delete every object and abort every upload under this run's prefix (a real endpoint keeps nothing)."""
    from chaos.storage import open_storage

    try:
        st = open_storage(target.url(""))
    except Exception:  # noqa: BLE001 - best effort
        return
    try:
        st._abort_uploads(st.prefix)
        st._delete_keys([o["Key"] for o in st._list(st.prefix)])
    except Exception:  # noqa: BLE001 - best effort; the embedded server is discarded anyway
        pass
    finally:
        st.close()
