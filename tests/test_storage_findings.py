"""``chaos findings`` on storage documents (#32): certify reports and ``chaos savers`` rows become
the storage findings table; bad documents are one line naming the file.

The documents here are shaped as ``chaos certify --json`` writes them (the keys the table
reads); the storage suite (``suites/test_storage.py``) makes real ones on real mounts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.certify.target import resolve
from chaos.cli import main as cli
from chaos.cli import storagefindings
from faults.disk import mount_of


def _prop(name: str, status: str, summary: str = "ok") -> dict:
    return {"name": name, "status": status, "summary": summary, "evidence": {}, "seconds": 0.1}


def _cert(**over) -> dict:
    doc = {
        "schema_version": 1, "kind": "certification", "backend": "file:///mnt/s3/c", "backend_kind": "posix",
        "date": "2026-12-06", "verdict": "NOT CERTIFIED", "certified": False, "failing": ["client_crash"],
        "not_tested": [], "partial": None,
        "mount": {"mount_point": "/mnt/s3", "fstype": "fuse.s3fs", "source": "s3fs", "client": "s3fs",
                  "options": ["rw", "nosuid", "nodev", "relatime", "user_id=0", "group_id=0"]},
        "properties": [_prop("read_after_write", "pass"),
                       _prop("client_crash", "fail", "fuse.s3fs client killed at its 2nd request of rename: "
                             "step-0000000002/ is listed without manifest.json | pipe"),
                       _prop("block_power_loss", "n/a", "fuse.s3fs: not a block file system")],
        "campaign": [{"name": "kill mid-save", "verdict": "pass", "error": None, "replay": "chaos run x"}],
    }
    doc.update(over)
    return doc


def _savers() -> dict:
    rows = [{"fs": "ext4", "options": o, "saver": s, "states": 20, "distinct": 10, "lost": lost, "torn": torn,
             "ok": 10 - lost - torn, "writes": 30, "flushes": 4, "seconds": 3.0}
            for o, s, lost, torn in (("data=ordered", "unsafe", 2, 0), ("data=ordered", "safe", 0, 0),
                                     ("data=writeback,noauto_da_alloc", "unsafe", 1, 3))]
    return {"schema_version": 1, "kind": "block-crash-savers", "date": "2026-12-06", "seed": 0,
            "host": {"kernel": "6.1.0", "machine": "x86_64"}, "rows": rows}


def _write(tmp_path: Path, name: str, doc: object) -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["findings", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_refused_mount_gets_its_row_advice_matrix_and_evidence(tmp_path, capsys):
    ext4 = _cert(backend="file:///mnt/e", verdict="CERTIFIED", certified=True, failing=[],
                 mount={"mount_point": "/mnt/e", "fstype": "ext4", "source": "/dev/loop3", "client": None,
                        "options": ["rw", "relatime"]},
                 properties=[_prop("read_after_write", "pass"), _prop("client_crash", "n/a"),
                             _prop("block_power_loss", "pass", "98 crash states checked, 50 distinct")])
    code, out, err = _cli(capsys, str(_write(tmp_path, "s3fs.json", _cert(suite_test="suites/test_storage.py::t"))),
                          str(_write(tmp_path, "ext4.json", ext4)))
    assert code == 0 and err == "", err
    rows = [line for line in out.splitlines() if line.startswith("| fuse.s3fs") or line.startswith("| ext4")]
    assert rows[0].startswith("| fuse.s3fs (s3fs) | 2026-12-06 | **NOT CERTIFIED** | client\\_crash |")
    assert "stage on local disk and upload with an object-store commit protocol" in rows[0]
    assert rows[1].startswith("| ext4 (data=ordered, the default) | 2026-12-06 | **CERTIFIED** | - |")
    assert "Save here directly" in rows[1]
    matrix = out[out.index("## Property by mount"):out.index("## Evidence")]
    assert "| client_crash | **FAIL** | n/a |" in matrix and "| block_power_loss | n/a | pass |" in matrix
    evidence = out[out.index("## Evidence"):]
    assert "step-0000000002/ is listed without manifest.json \\| pipe" in evidence  # a cell, escaped
    assert "Pinned by `suites/test_storage.py::t` (a strict xfail: the refusal is checked" in evidence
    assert "Nothing failed." in evidence and "## An unsafe" not in out


def test_untested_and_failed_campaign_scenarios_say_so_with_their_replay(tmp_path, capsys):
    doc = _cert(verdict="NOT TESTED", failing=[], not_tested=["campaign: bit flip: skipped"],
                campaign=[{"name": "bit flip", "verdict": "skipped", "error": "the flip changed nothing the reader saw",
                           "replay": "chaos run --fault bitflip:step=17"}])
    code, out, _ = _cli(capsys, str(_write(tmp_path, "c.json", doc)))
    assert code == 0
    assert "**NOT TESTED**" in out and "a scenario whose fault did nothing tested nothing" in out
    assert "campaign: bit flip**: the flip changed nothing the reader saw (replay: chaos run --fault" in out


def test_a_property_that_could_not_run_gets_no_advice_about_what_it_would_have_checked(tmp_path, capsys):
    doc = _cert(failing=["checksums_round_trip"], properties=[
        _prop("checksums_round_trip", "fail", "the check itself failed: NoValidCheckpointError: ... Input/output error")])
    code, out, _ = _cli(capsys, str(_write(tmp_path, "c.json", doc)))
    row = next(line for line in out.splitlines() if line.startswith("| fuse.s3fs"))
    assert code == 0 and storagefindings.ERRORED_ADVICE in row and storagefindings.ADVICE["checksums_round_trip"] not in row


def test_the_savers_rows_count_lost_and_torn_states(tmp_path, capsys):
    code, out, _ = _cli(capsys, str(_write(tmp_path, "savers.json", _savers())))
    assert code == 0 and "## Verdicts" not in out
    assert "| ext4 | data=ordered | unsafe | 20 | 10 | 2 | 0 | 8 | 2026-12-06 |" in out
    assert "| ext4 | data=writeback,noauto\\_da\\_alloc | unsafe | 20 | 10 | 1 | 3 | 6 | 2026-12-06 |" in out
    assert "(kernel 6.1.0)" in out


@pytest.mark.parametrize(("mount", "label"), [
    ({"fstype": "ext4", "options": ["rw", "relatime", "data=writeback"]}, "ext4 (data=writeback)"),
    ({"fstype": "ext4", "options": ["rw", "noauto_da_alloc", "data=ordered"]}, "ext4 (noauto_da_alloc, data=ordered)"),
    ({"fstype": "tmpfs", "options": ["rw", "size=4194304k"]}, "tmpfs"),
    ({"fstype": "xfs", "options": ["rw", "attr2", "inode64", "noquota"]}, "xfs"),
    ({"fstype": "fuse.rclone", "options": ["rw", "user_id=0"], "client": "rclone"}, "fuse.rclone (rclone)"),
    (None, "s3://bucket/prefix"),
])
def test_a_mount_is_named_by_its_type_and_the_options_that_change_a_crash(mount, label):
    full = None if mount is None else {"mount_point": "/m", "source": "x", "client": None} | mount
    assert storagefindings.label(full, "s3://bucket/prefix") == label


@pytest.mark.parametrize(("doc", "says"), [
    (_cert(verdict="MAYBE"), "$.verdict: 'MAYBE' is not one of"),
    (_cert(properties=[_prop("x", "flaky")]), "$.properties[0].status"),
    (_cert(mount={"fstype": "ext4"}), "$.mount: 'mount_point' is a required property"),
    ({"kind": "block-crash-savers", "date": "d", "rows": [{"fs": "ext4"}]}, "$.rows[0]: 'options' is a required"),
    ({"kind": "block-crash-savers", "date": "d", "rows": [_savers()["rows"][0] | {"lost": -1}]},
     "$.rows[0].lost: -1 is less than the minimum of 0"),
])
def test_a_bad_storage_document_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, doc, says):
    path = _write(tmp_path, "bad.json", doc)
    code, out, err = _cli(capsys, str(path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and str(path) in err and says in err, err


def test_out_writes_the_storage_markdown(tmp_path, capsys):
    target = tmp_path / "storage.md"
    code, out, err = _cli(capsys, str(_write(tmp_path, "c.json", _cert())), str(_write(tmp_path, "s.json", _savers())),
                          "--out", str(target))
    assert code == 0 and out == "" and "written to" in err
    text = target.read_text()
    assert text.startswith("## Verdicts") and "## An unsafe and a safe save" in text


def test_certify_reads_what_a_directory_is_mounted_on(tmp_path):
    """The report's ``mount``: the mountinfo entry of the target, not a guess from its path."""
    target = resolve(f"file://{tmp_path}")
    got = target.mount()
    m = mount_of(tmp_path)
    assert got is not None and m is not None
    assert (got["mount_point"], got["fstype"], got["source"]) == (m["mount_point"], m["fstype"], m["source"])
    assert got["client"] is None and isinstance(got["options"], list) and got["options"]
    assert os.path.realpath(tmp_path).startswith(got["mount_point"])
    assert resolve("s3://bucket/prefix?endpoint_url=http://127.0.0.1:9").mount() is None
