"""Payloads planted in a checkpoint's own format: each is real (an unsafe loader runs it),
runs nothing but the marker, and the loaders the project ships refuse it.

The DCP facts below are findings against torch 2.13 (see suites/test_payload.py, where
they are judged end to end): ``FileSystemReader.read_metadata`` reads ``.metadata`` with
``pickle.load``, and ``DefaultLoadPlanner.load_bytes`` reads every non-tensor value with
``torch.load(weights_only=False)``; both run a planted payload.
"""

from __future__ import annotations

import io
import logging
import pickle
import pickletools

import pytest
import torch

from chaos.reference.checkpoint import ReferenceCheckpointer
from faults import OutsideScratchRoot
from faults import payload as P


def small_state(k: int) -> dict:
    return {"model": {"w": torch.arange(64, dtype=torch.float32) + k, "b": torch.ones(16) * k},
            "optimizer": {"step": k}, "progress": {"step": k, "tokens": 10 * k}}


def globals_named(data: bytes) -> set[str]:
    """Every module.name a pickle imports (GLOBAL, or STACK_GLOBAL after two string pushes)."""
    out, strings = set(), []
    for op, arg, _pos in pickletools.genops(data):
        if op.name == "GLOBAL":
            out.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            out.add(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str):
            strings.append(arg)
    return out


def test_pickle_payload_runs_only_os_open_of_the_marker(tmp_path):
    marker = tmp_path / "marker"
    data = P.pickle_payload(str(marker))
    assert globals_named(data) == {"posix.open"}  # nothing but os.open
    assert not marker.exists()
    fd = pickle.loads(data)  # an unsafe loader
    assert marker.exists() and isinstance(fd, int)


def test_torchzip_payload_is_refused_by_weights_only_and_run_without(tmp_path):
    marker = tmp_path / "marker"
    blob = P.torchzip_payload(str(marker))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(io.BytesIO(blob), weights_only=True)
    assert not marker.exists()
    torch.load(io.BytesIO(blob), weights_only=False)  # the payload is real: torch.load accepts the zip
    assert marker.exists()


@pytest.mark.parametrize("size", [700, 1000, 1261, 6633, 1 << 20])
def test_torchzip_payload_fills_an_exact_slot(tmp_path, size):
    marker = tmp_path / "m"
    blob = P.torchzip_payload(str(marker), size)
    assert len(blob) == size
    torch.load(io.BytesIO(blob), weights_only=False)
    assert marker.exists()
    from faults import FaultError

    with pytest.raises(FaultError, match="cannot fill"):
        P.torchzip_payload(str(marker), 100)


def test_padded_pickle_runs_through_torch_load_legacy_path(tmp_path):
    marker = tmp_path / "m"
    blob = P.padded_pickle(str(marker), 1261)
    assert len(blob) == 1261
    with pytest.raises(RuntimeError, match="magic number"):  # the legacy loader runs the first pickle, then checks
        torch.load(io.BytesIO(blob), weights_only=False)
    assert marker.exists()


def test_plant_refuses_paths_outside_the_scratch_root(tmp_path):
    root = tmp_path / "scratch"
    root.mkdir()
    (root / "f.bin").write_bytes(b"x" * 10)
    outside = tmp_path / "precious"
    outside.write_bytes(b"keep")
    with pytest.raises(OutsideScratchRoot):
        P.plant(outside, "pickle", root / "m", scratch_root=root)
    with pytest.raises(OutsideScratchRoot):  # nor a marker outside
        P.plant(root / "f.bin", "pickle", tmp_path / "m", scratch_root=root)
    assert outside.read_bytes() == b"keep" and (root / "f.bin").read_bytes() == b"x" * 10


def _dcp_checkpoint(path) -> None:
    import torch.distributed.checkpoint as dcp

    logging.getLogger("torch.distributed.checkpoint").setLevel(logging.CRITICAL)
    with pytest.warns(UserWarning):  # "torch.distributed is disabled ... single process"
        dcp.save(small_state(3), checkpoint_id=str(path))


def _dcp_load(path) -> dict:
    import torch.distributed.checkpoint as dcp

    target = small_state(0)
    with pytest.warns(UserWarning):
        dcp.load(target, checkpoint_id=str(path))
    return target


@pytest.mark.parametrize("fmt", ["torchzip", "pickle"])
def test_dcp_byte_items_run_a_planted_payload(tmp_path, fmt):
    """DCP's DefaultLoadPlanner.load_bytes: torch.load(weights_only=False) on every non-tensor value."""
    d = tmp_path / "step-3"
    _dcp_checkpoint(d)
    shard = next(d.glob("*.distcp"))
    items = P.dcp_byte_items(str(shard))
    assert {fqn for fqn, _o, _n in items} == {"optimizer.step", "progress.step", "progress.tokens"}
    marker = tmp_path / "marker"
    rec = P.plant(shard, fmt, marker, scratch_root=tmp_path)
    assert rec.changed and [[s["start"], s["end"]] for s in rec.params["slots"]] == [[o, o + n] for _f, o, n in items]
    assert rec.size_after == rec.size_before  # in place: every tensor still reads
    try:
        loaded = _dcp_load(d)
    except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
        loaded = exc
    assert marker.exists(), f"the payload did not run: {loaded!r}"
    if fmt == "torchzip":  # and the load *succeeds*, with file descriptors for the values
        assert isinstance(loaded, dict) and loaded["optimizer"]["step"] != 3


def test_dcp_metadata_pickle_runs_on_load(tmp_path):
    """DCP's FileSystemReader.read_metadata: pickle.load(.metadata)."""
    d = tmp_path / "step-3"
    _dcp_checkpoint(d)
    marker = tmp_path / "marker"
    rec = P.plant(d / ".metadata", "pickle", marker, scratch_root=tmp_path)
    assert rec.changed and "slots" not in rec.params
    with pytest.raises(BaseException, match="metadata"):  # noqa: PT011 - CheckpointException is a BaseException
        _dcp_load(d)
    assert marker.exists()


def test_dcp_metadata_is_read_without_running_it(tmp_path):
    """The harness reads .metadata to find byte items, and refuses one that names other code."""
    from faults import FaultError

    d = tmp_path / "step-3"
    _dcp_checkpoint(d)
    shard = next(d.glob("*.distcp"))
    P.plant(d / ".metadata", "pickle", tmp_path / "m", scratch_root=tmp_path)
    with pytest.raises(FaultError, match=r"posix\.open"):
        P.dcp_byte_items(str(shard))
    assert not (tmp_path / "m").exists()


def _reference_with_two_steps(root) -> ReferenceCheckpointer:
    c = ReferenceCheckpointer(str(root), 0, 1, keep_last=2, metrics=False)
    c.save(1, small_state(1))
    c.save(2, small_state(2))
    c.wait()
    return c


@pytest.mark.parametrize("variant", P.HEADER_VARIANTS)
@pytest.mark.parametrize("verify", [True, False])
def test_reference_refuses_every_lying_safetensors_header(tmp_path, variant, verify):
    """Checksum on or off, a lying header is refused and the older step loads."""
    root = tmp_path / "ckpt"
    c = _reference_with_two_steps(root)
    shard = next(p for p in root.rglob("*.safetensors") if "2" in p.parent.name)
    rec = P.plant(shard, "safetensors-header", tmp_path / "m", scratch_root=tmp_path, variant=variant)
    assert rec.changed and rec.params["variant"] == variant
    step, state = ReferenceCheckpointer(str(root), 0, 1, verify=verify, metrics=False).load_latest(small_state(0))
    c.close()
    assert step == 1 and torch.equal(state["model"]["w"], small_state(1)["model"]["w"])


@pytest.mark.parametrize("variant", P.HEADER_VARIANTS)
def test_safetensors_library_refuses_every_lying_header(tmp_path, variant):
    """The Rust safetensors loader (what most users call) on the same files: a typed error each time."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    blob = safetensors_torch.save({"a": torch.arange(8, dtype=torch.float32), "b": torch.ones(8)})
    bad = P.safetensors_header_payload(blob, variant)
    from safetensors import SafetensorError

    with pytest.raises(SafetensorError):
        safetensors_torch.load(bad)


# ---------------------------------------------------------------- the environment and the oracle
def _record_with(fired: list[dict]):
    from chaos.record.history import RunRecord

    attempts = [{"attempt": 0, "outcome": "rank_failed", "detail": "", "fired": fired},
                {"attempt": 1, "outcome": "ok", "detail": "", "fired": []}]
    return RunRecord(1, attempts, {0: {0: []}, 1: {0: []}}, {}, {}, {})


def test_environment_checks_the_marker_after_every_attempt_and_the_oracle_reads_it(tmp_path):
    from chaos.judge.oracles import no_code_execution
    from chaos.nemesis.environment import Environment
    from chaos.plan.scenario import parse_fault
    from chaos.record.golden import GoldenRun

    scratch = tmp_path / "chaos-x"
    d = scratch / "ckpt" / "step-16"
    d.mkdir(parents=True)
    (d / "manifest.json").write_bytes(b'{"step": 16}')
    (scratch / "logs").mkdir()
    fault = parse_fault("payload:step=3,format=pickle,file=manifest.json")
    gold = GoldenRun("k", 1, {0: {}}, {0: []}, {0: {}})
    with Environment([fault], 1, str(scratch / "ckpt"), str(scratch / "logs"), 4) as env:
        (done,) = env.after_attempt(0, [fault], [])
        assert done["changed"] and done["kind"] == "payload" and done["target"] == "step-16/manifest.json"
        marker = done["marker"]["path"]
        assert marker.startswith(str(scratch)) and not (scratch / "ckpt" / "payload-markers").exists()
        fired = [{"spec": fault.spec(), "attempt": 0, "kind": "payload", "detail": {"corruption": done}}]
        env.after_attempt(1, [], [])
        assert done["marker"]["checks"] == [{"after": "attempt 1", "exists": False}]
        assert no_code_execution(gold, _record_with(fired)).passed
        pickle.loads((d / "manifest.json").read_bytes())  # what an unsafe loader would do
    assert done["marker"]["exists"] and done["marker"]["first_seen"] == "verification"
    result = no_code_execution(gold, _record_with(fired))
    assert not result.passed and "code ran" in result.summary and "verification" in result.summary
    assert result.evidence["cases"][0]["format"] == "pickle"


def test_oracle_fails_a_payload_whose_marker_was_never_checked():
    from chaos.judge.oracles import no_code_execution
    from chaos.record.golden import GoldenRun

    gold = GoldenRun("k", 1, {0: {}}, {0: []}, {0: {}})
    rec = {"kind": "payload", "changed": True, "params": {"format": "pickle"},
           "marker": {"path": "/x", "exists": False, "checks": [], "first_seen": None}}
    result = no_code_execution(gold, _record_with([{"spec": "payload:step=3", "attempt": 0, "detail": {"corruption": rec}}]))
    assert not result.passed and "unchecked" in result.summary
    assert no_code_execution(gold, _record_with([])).summary.startswith("not applicable")
