"""`chaos certify`: deliberately broken backends are not certified, and the report names the property.

Each broken wrapper in ``tests/backends/broken.py`` breaks one guarantee the way real
storage does; the matching property must fail for it and pass for the unbroken backend
(where that is cheap; the full unbroken runs are the ``slow`` end-to-end tests below).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chaos.certify import certify

BROKEN = str(Path(__file__).parent / "backends" / "broken.py")


def _run(spec: str, wrapper: str | None, prop: str) -> dict:
    return certify(spec, wrapper, campaign=False, throughput_mib=0, only=[prop])


def _status(report: dict, prop: str) -> str:
    return next(p["status"] for p in report["properties"] if p["name"] == prop)


@pytest.fixture()
def file_backend(tmp_path):
    d = tmp_path / "backend"
    d.mkdir()
    yield f"file://{d}"
    assert not any(d.iterdir()), "certify left files behind on the backend"


def test_copy_then_delete_rename_is_not_certified(file_backend):
    report = _run(file_backend, f"{BROKEN}:CopyThenDeleteRename", "commit_atomicity")
    assert not report["certified"] and "commit_atomicity" in report["failing"]
    p = next(p for p in report["properties"] if p["name"] == "commit_atomicity")
    assert "listed (committed) but does not load" in p["summary"] or "never saved" in p["summary"]


def test_lagging_list_is_not_certified(file_backend):
    report = _run(file_backend, f"{BROKEN}:LaggingList", "read_after_write")
    assert not report["certified"] and report["failing"] == ["read_after_write"]
    assert "list-after-write" in next(p["summary"] for p in report["properties"])
    assert _status(_run(file_backend, None, "read_after_write"), "read_after_write") == "pass"


def test_lagging_list_is_not_certified_on_fsspec_either(tmp_path):
    """The same wrapper through an fsspec URL: judged by its listing, not by a missing POSIX helper."""
    d = tmp_path / "backend"
    d.mkdir()
    report = _run(f"local://{d}", f"{BROKEN}:LaggingList", "read_after_write")
    assert report["backend_kind"] == "fsspec"
    assert not report["certified"] and report["failing"] == ["read_after_write"]
    assert "list-after-write" in report["properties"][0]["summary"]


@pytest.fixture()
def lagmem():
    from backends import lagfs

    lagfs.register()
    yield f"{lagfs.PROTOCOL}://certify-{uuid.uuid4().hex[:8]}/ckpt"
    lagfs.clear()


def test_a_listing_that_lags_for_other_clients_is_not_certified_through_fsspec(lagmem):
    """Hole 5: the reader must be a fresh fsspec instance (no instance or listing cache).

    ``lagmem://`` lists a file at once only to the client (instance) that wrote it; with
    fsspec's instance cache the "fresh" reader was the writer's own instance and passed.
    """
    report = _run(lagmem, None, "read_after_write")
    assert report["backend_kind"] == "fsspec"
    assert not report["certified"] and report["failing"] == ["read_after_write"]
    assert "list-after-write" in report["properties"][0]["summary"]


def test_ack_before_stored_is_not_certified():
    pytest.importorskip("moto")
    report = _run("s3-local", f"{BROKEN}:AckBeforeStored", "read_after_write")
    assert not report["certified"] and report["failing"] == ["read_after_write"]
    assert "read-after-write" in next(p["summary"] for p in report["properties"])


def test_ignoring_if_none_match_is_not_certified():
    pytest.importorskip("moto")
    report = _run("s3-local", f"{BROKEN}:IgnoresIfNoneMatch", "concurrent_writers")
    assert not report["certified"] and report["failing"] == ["concurrent_writers"]
    assert "2 writers acknowledged" in report["properties"][0]["summary"]
    good = _run("s3-local", None, "concurrent_writers")
    assert _status(good, "concurrent_writers") == "pass"
    assert not good["certified"] and good["partial"], "a partial run is never certified"


def test_bad_backend_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", "s3://Bad_Bucket/x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Bad_Bucket" in r.stderr and r.stderr.strip().count("\n") == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "s3-local"])
def test_certify_end_to_end(backend, tmp_path):
    """The done criterion: the reference checkpointer is certified on both backends (about 1 and 3 minutes)."""
    if backend == "file":
        (tmp_path / "b").mkdir()
        backend = f"file://{tmp_path / 'b'}"
    out = tmp_path / "cert.json"
    html = tmp_path / "cert.html"
    r = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", backend, "--json", str(out),
                        "--html", str(html), "--throughput-mib", "16"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["certified"] and report["campaign"] and report["throughput"]["save_mb_s"] > 0
    assert "CERTIFIED" in html.read_text()


@pytest.mark.slow
def test_dcp_fsspec_writer_findings(tmp_path):
    """DCP on S3: round trip fine; overwrite in place and bit flips are not (about 30 s)."""
    pytest.importorskip("s3fs")
    from chaos.certify.dcp_fsspec import certify_dcp
    from chaos.certify.target import resolve

    t = resolve("s3-local")
    try:
        verdicts = {v["name"]: v["status"] for v in certify_dcp(t, str(tmp_path), max_points=8)}
    finally:
        t.local_s3.stop()
    assert verdicts["round_trip"] == "pass"
    assert verdicts["checksum_detection"] == "fail"
    assert verdicts["overwrite_in_place"] == "fail"


def test_certification_page_names_the_failing_property():
    from reports.html import render_certification

    report = {"backend": "file:///x<script>", "backend_kind": "posix", "wrapper": None, "checkpointer": "reference",
              "seconds": 1.0, "seed": 0, "certified": False, "failing": ["commit_atomicity"], "partial": None,
              "commit_protocol": "rename", "campaign": [], "throughput": None, "dcp": None,
              "properties": [{"name": "commit_atomicity", "status": "fail", "summary": "step 2 listed but does not load",
                              "evidence": {"ops": 3}, "seconds": 0.1}]}
    page = render_certification(report)
    assert "not certified" in page and "commit_atomicity" in page and "step 2 listed but does not load" in page
    assert "<script>" not in page, "values are escaped"


def test_fsspec_backend_commit_point_survives_every_crash_and_races_are_never_passed(tmp_path):
    """The generic fsspec protocol (commit object moved into place) on local://: every crash
    point leaves only complete committed steps; a check-then-put commit can never earn a
    pass for concurrent writers, only n/a with the reason."""
    d = tmp_path / "backend"
    d.mkdir()
    spec = f"local://{d}"
    atomic = _run(spec, None, "commit_atomicity")
    assert atomic["backend_kind"] == "fsspec" and "temp name, then move" in atomic["commit_protocol"]
    assert _status(atomic, "commit_atomicity") == "pass"
    race = _run(spec, None, "concurrent_writers")
    p = next(p for p in race["properties"] if p["name"] == "concurrent_writers")
    assert p["status"] == "n/a" and "check-then-put" in p["summary"] and "never a mixture" in p["summary"]
    assert not any(d.iterdir()), "certify left files behind on the backend"


def _clean_env(home: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "CHAOS_CACHE_DIR", "TMP", "TEMP")}
    return env | {"HOME": str(home), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}


def _git_status() -> str:
    repo = Path(__file__).resolve().parent.parent
    return subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=60).stdout


def test_certify_writes_nothing_outside_its_scratch_root_and_quick_is_never_certified(tmp_path):
    """Hole 8: a certification of local:// (battery, kill campaign with its golden run,
    throughput) leaves nothing in HOME (no ~/.cache golden runs), in TMPDIR (no
    chaos-fsspec-* / chaos-ckpt-* dirs), in the cwd, on the backend or in the repo. Hole 5,
    in the same run (a certification costs about 10 s): --quick skips the bit-flip and
    power-loss scenarios, so even with every property and the one scenario passing it is a
    partial run, exit 1 with the reason, never certified."""
    home, tmp, cwd, backend = (tmp_path / n for n in ("home", "tmp", "cwd", "backend"))
    for d in (home, tmp, cwd):
        d.mkdir()
    git_before = _git_status()
    out = tmp_path / "cert.json"
    r = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", f"local://{backend}",
                        "--quick", "--throughput-mib", "4", "--json", str(out)],
                       cwd=cwd, env=_clean_env(home, tmp), capture_output=True, text=True, timeout=300)
    report = json.loads(out.read_text())
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert not report["certified"] and not report["failing"] and not report["not_tested"], report["failing"]
    assert "--quick" in report["partial"] and "NOT CERTIFIED (partial run (--quick" in r.stdout
    assert [s["faults"] for s in report["campaign"]] == [["kill:rank=1,phase=write_shards,step=15"]]
    assert report["campaign"][0]["verdict"] == "pass" and report["throughput"]["save_mb_s"] > 0
    from chaos.certify import campaign_scenarios
    from chaos.certify.target import resolve

    posix = resolve(f"file://{cwd}")  # where --quick drops scenarios: a file system's campaign has three
    assert [f for _, f, _ in campaign_scenarios(posix, quick=True)] == [["kill:rank=1,phase=write_shards,step=15"]]
    assert len(campaign_scenarios(posix)) == 3
    left = {d.name: sorted(str(p.relative_to(d)) for p in d.rglob("*")) for d in (home, tmp, cwd, backend)}
    assert left == {"home": [], "tmp": [], "cwd": [], "backend": []}
    assert _git_status() == git_before


def _small_save(root: Path) -> None:
    """A save that does one of each op kind certify crashes before, and a read that must not count."""
    d = root / "ck"
    os.mkdir(d)
    with open(d / "a.tmp", "wb") as f:
        f.write(b"head")
        f.write(b"body")
        f.flush()
        os.fsync(f.fileno())
    with open(d / "a.tmp", "rb") as f:  # a read: not a mutating op
        f.read()
    os.replace(d / "a.tmp", d / "a")
    os.rename(d / "a", d / "b")
    os.unlink(d / "b")
    os.rmdir(d)


def test_crash_points_count_every_mutating_op_kind(tmp_path):
    """What ``commit_atomicity`` crashes before, op by op: mkdir, an open for writing, each
    write() call, fsync, replace, rename, unlink, rmdir (a read is not counted). Dropping a
    kind here silently removes crash points from every certification."""
    from chaos.certify.crash import run_crashing

    outcome, ops = run_crashing(lambda: _small_save(tmp_path), None)
    assert outcome == "completed"
    assert [o.split()[0] for o in ops] == ["mkdir", "open", "write", "write", "fsync", "replace", "rename",
                                           "unlink", "rmdir"], ops
    names = [o.split(maxsplit=1)[1] for o in ops if not o.startswith("fsync")]
    assert names == ["ck", "a.tmp", "a.tmp", "a.tmp", "a.tmp", "a", "b", "ck"], ops
    # A crash before each op stops there, nothing after it done: before the replace, a.tmp is whole and not yet a.
    outcome, _ = run_crashing(lambda: _small_save(tmp_path), ops.index(next(o for o in ops if o.startswith("replace"))) + 1)
    assert outcome == "crashed"
    assert (tmp_path / "ck" / "a.tmp").read_bytes() == b"headbody" and not (tmp_path / "ck" / "a").exists()


def test_crash_points_count_s3_mutating_requests_only():
    """On S3 the points are the mutating API calls through botocore (PutObject, DeleteObject, ...), not reads."""
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import Stubber

    from chaos.certify.crash import run_crashing

    def requests() -> None:
        client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        with Stubber(client) as stub:
            stub.add_response("put_object", {}, {"Bucket": "b", "Key": "k/latest", "Body": b"1"})
            stub.add_response("head_object", {"ContentLength": 1}, {"Bucket": "b", "Key": "k/latest"})
            stub.add_response("delete_object", {}, {"Bucket": "b", "Key": "k/latest"})
            client.put_object(Bucket="b", Key="k/latest", Body=b"1")
            client.head_object(Bucket="b", Key="k/latest")
            client.delete_object(Bucket="b", Key="k/latest")

    assert run_crashing(requests, None) == ("completed", ["PutObject k/latest", "DeleteObject k/latest"])
    assert run_crashing(requests, 2)[0] == "crashed"


def test_a_memory_backed_mount_is_staging_only_and_a_disk_is_a_durable_medium(tmp_path, file_backend):
    """#32: found from the mount (/proc/self/mountinfo), never guessed from the path."""
    from faults.disk import can_mount_tmpfs, memory_backed, mount_of

    m = mount_of(file_backend[len("file://"):])
    if m is None or memory_backed(m):
        pytest.skip(f"the test's temp dir is itself memory-backed here ({m})")
    report = _run(file_backend, None, "durable_medium")  # --only: a partial run, never certified as a whole
    assert _status(report, "durable_medium") == "pass" and report["failing"] == []
    ok, why = can_mount_tmpfs()
    if not ok:
        pytest.skip(why)
    mnt = tmp_path / "shm"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True, timeout=20)
    try:
        report = _run(f"file://{mnt}", None, "durable_medium")
        p = next(p for p in report["properties"] if p["name"] == "durable_medium")
        assert report["failing"] == ["durable_medium"] and report["verdict"] == "NOT CERTIFIED"
        assert "memory-backed file system (tmpfs" in p["summary"] and "Staging only" in p["summary"]
        assert p["evidence"]["mount_point"] == str(mnt) and p["evidence"]["fstype"] == "tmpfs"
        assert report["mount"]["mount_point"] == str(mnt) and report["mount"]["fstype"] == "tmpfs"
        assert "size=4096k" in report["mount"]["options"] and report["mount"]["client"] is None
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", report["date"])  # the findings table's date column
        assert not any(mnt.iterdir())  # certify left nothing on the backend
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=20)


def test_a_scenario_that_tested_nothing_neither_certifies_nor_refuses():
    """#32: a bit flip the reader never saw made a run NOT CERTIFIED one day and not the next."""
    from chaos.certify import decide

    passed = [("read_after_write", "pass"), ("full_disk", "n/a")]
    kill = {"name": "kill mid-save", "verdict": "pass", "error": None}
    flip = {"name": "bit flip", "verdict": "skipped", "error": "skipped: fault bitflip did nothing"}
    assert decide(passed, [kill], None, []) == ("CERTIFIED", [], [], [])
    verdict, failing, untested, _ = decide(passed, [kill, flip], None, [])
    assert (verdict, failing) == ("NOT TESTED", []) and untested == [
        "campaign: bit flip: skipped: fault bitflip did nothing"]
    broken = {"name": "power loss", "verdict": "fail", "error": None}
    assert decide(passed, [kill, flip, broken], None, [])[:2] == ("NOT CERTIFIED", ["campaign: power loss"])
    assert decide([("commit_atomicity", "fail")], [flip], None, [])[0] == "NOT CERTIFIED"
    assert decide(passed, [kill], None, ["--quick"])[0] == "NOT CERTIFIED"  # partial: never certified


def test_a_throughput_load_that_fails_refuses_the_backend_instead_of_ending_certify(tmp_path):
    """#32: on an rclone mount the throughput's verified load read EIO and certify ended as a harness
    error (exit 2) with no report; now that failure is in the report and refuses the backend."""
    from chaos.certify import decide, measure_throughput
    from chaos.certify.target import resolve

    root = tmp_path / "backend"
    root.mkdir()
    target = resolve(f"file://{root}", f"{BROKEN}:LaggingList")  # the fresh step is not listed yet
    got = measure_throughput(target, str(tmp_path), mib=1, repeats=1)
    assert "save_mb_s" not in got and got["bytes"] > 0
    assert "NoValidCheckpointError" in got["error"] or "found nothing" in got["error"], got
    assert decide([("read_after_write", "pass")], [], None, [], got["error"])[:2] == ("NOT CERTIFIED", ["throughput"])


def test_a_long_storage_error_keeps_what_went_wrong_at_its_end():
    """#32: on a deep mount path the evidence was cut before "Input/output error"."""
    from chaos.certify.harness import error_text

    exc = OSError(f"/mnt/{'d' * 400}/step-0000000001/manifest.json: cannot be opened: Input/output error")
    text = error_text(exc, 200)
    assert len(text) <= 200 and text.startswith("OSError: /mnt/ddd") and text.endswith("Input/output error")
    assert error_text(ValueError("short\n  message"), 200) == "ValueError: short message"


def test_two_refused_writers_with_nothing_committed_are_not_a_failure_of_concurrent_writers(tmp_path):
    """Seen once on a tmpfs: both racing writers were refused and nothing was committed, and the
    property said "fail: the step holds neither writer's complete state" though nothing was promised."""
    from chaos.certify.battery import concurrent_writers
    from chaos.certify.harness import Bench
    from chaos.certify.target import resolve

    root = tmp_path / "backend"
    root.mkdir()
    check = concurrent_writers(Bench(resolve(f"file://{root}", f"{BROKEN}:RefusesPublish"), str(tmp_path)))
    assert check.result == "not_judged", (check.result, check.summary)
    assert check.summary.startswith("both writers were refused and nothing was committed")
    assert all(v.startswith("rejected") for v in check.evidence["writers"].values())
