"""At-rest corruption of the newest committed checkpoint, then a restart.

Every rank is killed at step 19 (after the save at 16), one file of the newest
checkpoint is corrupted exactly as recorded, and the job restarts. A correct
checkpointer detects the damage and falls back to the previous checkpoint (or refuses
with a clear error); loading a state that was never saved is silent corruption.
Known defects of third-party checkpointers are strict xfails carrying the evidence,
so the suite stays green and a fix upstream turns it red.
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.chaos

FAULTS = {
    "bitflip-data": "bitflip:step=19,bits=16,region=data,seed=3,file={shard}",
    # drawn uniformly over the whole length (region=any, the default), and placed in the middle: deep in the tensors
    "bitflip-anywhere": "bitflip:step=19,bits=16,seed=3,file={shard}",
    "zero-middle": "zero:step=19,at=0.5,length=4096,seed=3,file={shard}",
    "truncate": "truncate:step=19,fraction=0.5,seed=3,file={shard}",
    "delete": "delete:step=19,seed=3,file={shard}",
}
SHORT = {"steps": 24, "save_every": 4}  # conftest.SUITE_WORKLOAD, for scenarios run without run_fault
SHARD = {"reference": "*.safetensors", "dcp": "*.distcp", "dcp-async": "*.distcp", "torch-save": "*.pt"}
SILENT, NO_FALLBACK = "silent", "no-fallback"
KNOWN = {
    ("dcp", "bitflip-data"): (SILENT, "DCP has no checksums: a bit-flipped .distcp shard loads silently and training diverges"),
    ("dcp-async", "bitflip-data"): (SILENT, "DCP has no checksums: a bit-flipped .distcp shard loads silently and training diverges"),
    ("dcp", "truncate"): (NO_FALLBACK, "DCP loads the newest .metadata directory only: a truncated shard fails every restart"),
    ("dcp-async", "truncate"): (NO_FALLBACK, "DCP loads the newest .metadata directory only: a truncated shard fails every restart"),
    ("dcp", "delete"): (NO_FALLBACK, "DCP loads the newest .metadata directory only: a deleted shard fails every restart"),
    ("dcp-async", "delete"): (NO_FALLBACK, "DCP loads the newest .metadata directory only: a deleted shard fails every restart"),
    ("torch-save", "bitflip-data"): (SILENT, "torch.load does not verify zip CRCs: flipped tensor bytes load silently"),
    ("dcp", "bitflip-anywhere"): (SILENT, "DCP has no checksums: bits flipped anywhere in a .distcp shard load silently"),
    ("dcp-async", "bitflip-anywhere"): (SILENT, "DCP has no checksums: bits flipped anywhere in a .distcp shard load silently"),
    ("dcp", "zero-middle"): (SILENT, "DCP has no checksums: 4 KiB zeroed in the middle of a .distcp shard load silently"),
    ("dcp-async", "zero-middle"): (SILENT, "DCP has no checksums: 4 KiB zeroed in the middle of a .distcp shard load silently"),
    ("torch-save", "bitflip-anywhere"): (SILENT, "torch.load does not verify zip CRCs: bits flipped anywhere in the tensors load silently"),
    ("torch-save", "zero-middle"): (NO_FALLBACK, "the zeroed 4 KiB take a zip record header in the middle of the .pt (torch's reader "
                                                 "refuses it), and `latest` points at that file: there is no fallback"),
    ("torch-save", "truncate"): (NO_FALLBACK, "`latest` points at the truncated file; there is no fallback to an older one"),
    ("torch-save", "delete"): (NO_FALLBACK, "`latest` points at the deleted file; there is no fallback to an older one"),
}


class KnownDefect(AssertionError):
    """Raised only when a run fails in exactly the documented way; any other failure stays red."""


def _shows(defect: str, result) -> bool:
    oracle = result.oracles.get("bit_exact")
    if result.verdict != "fail" or oracle is None:
        return False
    if defect == SILENT:  # the job finished, on a state that was never saved
        return result.record.completed and oracle.evidence.get("first_loss_difference") is not None
    return "did not finish" in oracle.summary


@pytest.mark.parametrize("corruption", sorted(FAULTS))
def test_corrupted_newest_checkpoint_is_detected_or_survived(request, chaos, run_fault, checkpointer, corruption):
    known = KNOWN.get((checkpointer, corruption))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=KnownDefect, reason=known[1]))
    fault = FAULTS[corruption].format(shard=SHARD.get(checkpointer, "*"))
    result = run_fault(checkpointer, fault)
    corrupted = result.record.fired_faults()[0]["detail"]["corruption"]
    assert corrupted.get("changed", True), f"the corruption changed nothing: {corrupted}"
    if known and _shows(known[0], result):
        raise KnownDefect(f"{known[1]}\n{chaos.explain(result)}")
    chaos.check(result)


@pytest.mark.parametrize("fault", [
    "bitflip:step=19,bits=4,seed=3,file=*.nothing-matches",  # the glob matched no file
    "truncate:step=19,fraction=1.0,seed=3,file=*.safetensors",  # cut to its own size: no byte changed
])
def test_corruption_that_did_nothing_is_skipped(chaos, fault):
    """A green run after a corruption that changed no byte tested nothing: skipped, with the reason."""
    result = chaos.run(chaos.scenario("reference", [fault], **SHORT))
    corrupted = result.record.fired_faults()[0]["detail"]["corruption"]
    assert corrupted["changed"] is False and corrupted["reason"]
    assert result.verdict == "skipped", chaos.explain(result)
    assert "did nothing" in result.error and corrupted["reason"] in result.error
    assert result.oracles["checksum_detection"].evidence["cases"][0]["class"] == "did nothing"


@pytest.mark.s3
def test_corruption_acts_on_the_objects_of_an_s3_store(chaos):
    """storage=s3://...: the newest committed checkpoint's objects are corrupted in the store itself."""
    pytest.importorskip("moto")
    from chaos.certify.local_s3 import LocalS3

    with LocalS3() as s3:
        sc = chaos.scenario("reference", ["bitflip:step=19,bits=16,region=data,seed=3,file=*.safetensors"],
                            ckpt_options={"storage": s3.url()}, **SHORT)
        sc.backend = "s3"
        result = chaos.run(sc)
    corrupted = result.record.fired_faults()[0]["detail"]["corruption"]
    assert corrupted["changed"] and corrupted["step"] == 16, corrupted
    assert corrupted["objects_written"] == [corrupted["target_object"].split("/", 3)[3]]
    case = result.oracles["checksum_detection"].evidence["cases"][0]
    assert case["class"] in ("fell back", "detected") and case["offsets"], case
    chaos.check(result)


PARTIAL = f"{Path(__file__).parents[1] / 'tests' / 'checkpointers' / 'partial_checksum.py'}:PartialChecksumCheckpointer"


def test_a_checksum_of_the_header_only_survives_header_flips(chaos, run_fault):
    chaos.check(run_fault(PARTIAL, "bitflip:step=19,bits=4,region=header,seed=3,file=rank0.pt"))


@pytest.mark.parametrize("where", ["at=0.5", "seed=3"])  # the middle of the shard; a uniform draw over its length
def test_flips_deep_in_the_data_catch_a_checksum_of_the_header_only(chaos, run_fault, where):
    """partial_checksum.py hashes the first 64 KiB of each ~19 MB shard: a flip past that loads silently."""
    result = run_fault(PARTIAL, f"bitflip:step=19,bits=4,file=rank0.pt,{where}")
    detection = result.oracles["checksum_detection"]
    case = detection.evidence["cases"][0]
    assert result.verdict == "fail" and not detection.passed, chaos.explain(result)
    assert case["class"] == "silent corruption" and min(case["offsets"]) > 65536, case
    assert case["size"] > 10 * 65536
