"""Loading must never execute code from the checkpoint.

Every rank is killed at step 19 (after the save at 16), a payload in the checkpoint's
own format is planted in one file of the newest checkpoint (see ``faults/payload.py``),
and the job restarts. The payload's only code creates a marker file in the scenario's
scratch root; the environment looks for it after every attempt, and the
``no_code_execution`` oracle fails if it exists. A correct loader refuses the file
(and falls back to the previous checkpoint, or stops with a clear error).

Findings against torch 2.13, kept as strict xfails that name exactly the failure seen:

- DCP ``FileSystemReader.read_metadata`` reads ``.metadata`` with ``pickle.load``: a
  pickle planted there runs in every rank (then DCP raises ``CheckpointException``,
  a ``BaseException``, and every restart runs it again).
- DCP ``DefaultLoadPlanner.load_bytes`` reads each non-tensor value (ints, RNG state,
  anything not a tensor) with ``torch.load(weights_only=False)``: a torch zip planted in
  a byte item of a ``.distcp`` file runs, and the load *succeeds*, handing the
  payload's return value (a file descriptor) to the job as its step counter.
- ``torch.load`` in the torch-save adapter uses ``weights_only=True`` and refuses both
  payloads without running them, but ``latest`` names the refused file and there is
  no fallback, so every restart fails (the same defect the corruption suite records).
"""

import pytest

pytestmark = pytest.mark.chaos

TARGETS = {  # (checkpointer, format) -> the file the payload goes into
    ("reference", "pickle"): "manifest.json",
    ("reference", "torchzip"): "*.safetensors",
    ("reference", "safetensors-header"): "*.safetensors",
    ("dcp", "pickle"): ".metadata",
    ("dcp", "torchzip"): "*.distcp",
    ("dcp-async", "pickle"): ".metadata",
    ("dcp-async", "torchzip"): "*.distcp",
    ("torch-save", "pickle"): "*.pt",
    ("torch-save", "torchzip"): "*.pt",
}
CODE_RAN, NO_FALLBACK = "code-ran", "no-fallback"
_META = ("DCP's FileSystemReader.read_metadata unpickles .metadata with pickle.load (torch 2.13 "
         "torch/distributed/checkpoint/filesystem.py): the planted pickle ran in the ranks")
_BYTES = ("DCP's DefaultLoadPlanner.load_bytes reads non-tensor values with torch.load(weights_only=False) "
          "(torch 2.13 torch/distributed/checkpoint/default_planner.py): the zip planted in a .distcp byte item "
          "ran in the ranks, and the load succeeded with its return value as state")
_REFUSED = ("torch.load(weights_only=True) refuses the payload without running it, but `latest` names the "
            "refused file and there is no fallback: every restart fails")
KNOWN = {
    ("dcp", "pickle"): (CODE_RAN, _META),
    ("dcp-async", "pickle"): (CODE_RAN, _META),
    ("dcp", "torchzip"): (CODE_RAN, _BYTES),
    ("dcp-async", "torchzip"): (CODE_RAN, _BYTES),
    ("torch-save", "pickle"): (NO_FALLBACK, _REFUSED),
    ("torch-save", "torchzip"): (NO_FALLBACK, _REFUSED),
}


class KnownDefect(AssertionError):
    """Raised only when a run fails in exactly the documented way; any other failure stays red."""


def _shows(defect: str, result) -> bool:
    ran = result.oracles["no_code_execution"]
    if defect == CODE_RAN:
        return not ran.passed and all(c["class"] == "code ran" for c in ran.evidence["cases"])
    liveness = result.oracles.get("liveness")
    return ran.passed and liveness is not None and not liveness.passed


@pytest.mark.parametrize("fmt", ["pickle", "torchzip", "safetensors-header"])
def test_planted_payload_never_runs(request, chaos, run_fault, checkpointer, fmt):
    target = TARGETS.get((checkpointer, fmt))
    if target is None:
        pytest.skip(f"a {checkpointer} checkpoint has no file in the {fmt} format")
    known = KNOWN.get((checkpointer, fmt))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=KnownDefect, reason=known[1]))
    result = run_fault(checkpointer, f"payload:step=19,format={fmt},seed=3,file={target}")
    planted = result.record.fired_faults()[0]["detail"]["corruption"]
    assert planted["changed"], f"the payload changed nothing: {planted}"
    assert planted["marker"]["checks"], "the environment never looked for the marker"
    if known and _shows(known[0], result):
        raise KnownDefect(f"{known[1]}\n{chaos.explain(result)}")
    chaos.check(result)


def test_oracle_catches_a_loader_that_unpickles(chaos, run_fault):
    """The careful test checkpointer loads with torch.load(weights_only=False): the oracle must fail it."""
    from pathlib import Path

    careful = f"{Path(__file__).parents[1] / 'tests' / 'checkpointers' / 'careful.py'}:CarefulCheckpointer"
    result = run_fault(careful, "payload:step=19,format=torchzip,seed=3,file=rank0.pt")
    ran = result.oracles["no_code_execution"]
    assert result.verdict == "fail" and not ran.passed, chaos.explain(result)
    assert ran.evidence["cases"][0]["first_seen_after"] == "attempt 1"
