"""What a SIGKILLed harness leaves is removed by the next one (``chaos.scratch``, ``chaos clean``).

A real harness-like process claims roots (one kept), a tmpfs on one, a rank-like child in
a session of its own marked with the root, and a network lab; it is SIGKILLed, and the
sweep must remove exactly what it claimed and was not kept. Every test has its own
claims directory (``CHAOS_CLAIMS_DIR``), so no other harness's claims are touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from chaos import scratch
from faults.disk import mounts_under, unmount_all
from faults.process import alive, marked_under, start_ticks

REPO = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0

# A harness that claims what the test asks for, says what it made, and waits to be killed.
HARNESS = r"""
import json, os, subprocess, sys, time
from chaos import scratch
base, want = sys.argv[1], sys.argv[2].split(",")
out = {"root": scratch.make_root("chaos-t-", base), "kept": scratch.make_root("chaos-t-", base, keep=True)}
if "mount" in want:
    from faults.disk import mount
    os.makedirs(out["root"] + "/mnt")
    mount("tmpfs", out["root"] + "/mnt", "tmpfs", 0, "size=1m")
    with open(out["root"] + "/mnt/data", "wb") as f:
        f.write(b"x" * 4096)
if "rank" in want:  # a rank that left its process group: only its mark finds it
    env = dict(os.environ, CHAOS_SCENARIO=out["root"])
    out["rank"] = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True).pid
if "net" in want:
    from faults.network import NetworkLab
    lab = NetworkLab(2)
    scratch.claim_netns(lab.suffix)
    lab.setup()
    out["netns"] = lab.suffix
print(json.dumps(out), flush=True)
time.sleep(600)
"""


def _killed_harness(tmp_path: Path, want: str) -> dict:
    """Start HARNESS, read what it made, SIGKILL it, reap it; what it made."""
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", HARNESS, str(base), want], stdout=subprocess.PIPE, text=True,
                         cwd=REPO, env=dict(os.environ))
    try:
        line = p.stdout.readline()
        assert line, "the harness died before it made anything"
        made = json.loads(line)
    finally:
        p.kill()
        p.wait(timeout=30)
    made["pid"] = p.pid
    return made


def _forget(made: dict) -> None:
    """Test clean-up whatever the sweep did: nothing of the harness may outlive the test."""
    if made.get("rank") and alive(made["rank"]):
        os.kill(made["rank"], signal.SIGKILL)
    for key in ("root", "kept"):
        if os.path.isdir(made[key]):
            unmount_all(made[key])
            shutil.rmtree(made[key], ignore_errors=True)
    if made.get("netns"):
        from faults.network import remove_leftovers

        remove_leftovers(made["netns"])


def _wait_dead(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_the_sweep_removes_a_killed_harness_root_and_its_marked_rank_and_keeps_the_kept_root(tmp_path, claims):
    made = _killed_harness(tmp_path, "rank")
    try:
        assert os.path.isdir(made["root"]) and alive(made["rank"])
        assert marked_under(made["root"]) == [made["rank"]]
        [claim] = scratch.claims()
        assert claim.state == "gone" and claim.pid == made["pid"]

        dry = scratch.sweep(dry_run=True)
        assert [d.removed for d in dry] == [[made["root"]]]
        assert os.path.isdir(made["root"]) and alive(made["rank"]), "a dry run removed something"

        [done] = scratch.sweep()
        assert done.pid == made["pid"] and done.removed == [made["root"]] and done.kept == [made["kept"]]
        assert done.killed == [made["rank"]] and _wait_dead(made["rank"])
        assert not os.path.exists(made["root"])
        assert os.path.isdir(made["kept"]), "a root made with keep was removed"
        assert f"pid {made['pid']}" in done.line() and made["root"] in done.line()
        assert _no_claim_files(claims), "the swept claim file is still there"
        assert scratch.sweep() == []  # nothing twice
    finally:
        _forget(made)


@pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs needs root")
def test_the_sweep_unmounts_the_tmpfs_a_killed_harness_left(tmp_path, claims):
    made = _killed_harness(tmp_path, "mount")
    try:
        assert mounts_under(made["root"]) == [made["root"] + "/mnt"]
        [done] = scratch.sweep()
        assert done.unmounted == [made["root"] + "/mnt"] and done.removed == [made["root"]]
        assert mounts_under(tmp_path) == [] and not os.path.exists(made["root"])
    finally:
        _forget(made)


def _netns_ok() -> tuple[bool, str]:
    if not IS_ROOT or shutil.which("ip") is None:
        return False, "network namespaces need root and iproute2"
    from faults.network import can_use_netns

    return can_use_netns()


@pytest.mark.skipif(not _netns_ok()[0], reason=_netns_ok()[1])
def test_the_sweep_deletes_the_network_lab_a_killed_harness_left(tmp_path, claims):
    from faults.network import leftovers

    made = _killed_harness(tmp_path, "net")
    try:
        left = leftovers(made["netns"])
        assert {f"netns:chaos-{made['netns']}-r0", f"netns:chaos-{made['netns']}-r1"} <= set(left)
        [done] = scratch.sweep()
        assert sorted(done.netns) == left
        assert leftovers(made["netns"]) == []
    finally:
        _forget(made)


def test_a_live_harness_claims_are_never_swept(tmp_path, claims):
    base = tmp_path / "base"
    base.mkdir()
    p = subprocess.Popen([sys.executable, "-c", HARNESS, str(base), "none"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        made = json.loads(p.stdout.readline())
        [claim] = scratch.claims()
        assert claim.state == "alive" and claim.pid == p.pid
        assert scratch.sweep() == []
        assert os.path.isdir(made["root"]) and os.path.isdir(made["kept"])
    finally:
        p.kill()
        p.wait(timeout=30)
    [done] = scratch.sweep()  # once it is gone, it is swept
    assert done.removed == [made["root"]]
    shutil.rmtree(made["kept"])


def _root(path: Path, keep: bool = False) -> dict:
    """A root entry as ``make_root`` writes it for the directory (or link) at ``path``."""
    st = os.lstat(path)
    return {"root": str(path), "keep": keep, "dev": st.st_dev, "ino": st.st_ino, "since": scratch.now_ticks()}


def _no_claim_files(claims: Path) -> bool:
    return not claims.exists() or not [p for p in claims.iterdir() if ".jsonl" in p.name]


def _claim_file(claims: Path, name: str, *entries: dict, **owner: str) -> Path:
    """A claim file as a harness writes it: an owner line (this host and boot unless given), then ``entries``."""
    claims.mkdir(mode=0o700, exist_ok=True)
    path = claims / name
    head = {"owner": {"pid": 1, "argv": ["x"], "host": scratch._host(), "boot": scratch._boot_id(), **owner}}
    path.write_text("".join(json.dumps(e) + "\n" for e in [head, *entries]))
    return path


def test_a_reused_pid_is_not_the_owner_and_another_pid_namespace_is_never_judged(tmp_path, claims):
    ns = scratch._pid_ns()
    reused, foreign = tmp_path / "chaos-reused", tmp_path / "chaos-foreign"
    reused.mkdir()
    foreign.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        start = start_ticks(sleeper.pid)
        # the sleeper's pid, but a start time it never had: a dead harness whose pid was reused
        _claim_file(claims, f"{ns}-{sleeper.pid}-{start + 1}.jsonl", _root(reused))
        _claim_file(claims, f"1-{sleeper.pid}-{start + 1}.jsonl", _root(foreign))
        states = {c.path.split("/")[-1].split("-")[0]: c.state for c in scratch.claims()}
        assert states == {ns: "gone", "1": "foreign"}
        [done] = scratch.sweep()
        assert done.removed == [str(reused)] and not reused.exists()
        assert foreign.is_dir() and alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_host_is_never_judged_and_an_earlier_boot_is_gone_even_for_a_live_pid(tmp_path, claims):
    """A TMPDIR shared between nodes holds other hosts' claims; after a reboot every owner is dead."""
    ns = scratch._pid_ns()
    other_host, rebooted, torn = tmp_path / "chaos-host", tmp_path / "chaos-boot", tmp_path / "chaos-torn"
    for d in (other_host, rebooted, torn):
        d.mkdir()
    me, start = os.getpid(), start_ticks(os.getpid())  # a pid and start time that are alive here
    _claim_file(claims, f"{ns}-{me + 1}-{start}.jsonl", _root(other_host), host="node-17")
    _claim_file(claims, f"{ns}-{me}-{start}.jsonl", _root(rebooted), boot="0-earlier")
    (claims / f"{ns}-{me + 2}-{start}.jsonl").write_text('{"owner": {"pid": 3, "ho' + "\n" + json.dumps(
        _root(torn)) + "\n")  # the owner line torn: whose is it?
    states = {c.pid: c.state for c in scratch.claims()}
    assert states == {me + 1: "foreign", me: "gone", me + 2: "foreign"}
    [done] = scratch.sweep()
    assert done.removed == [str(rebooted)] and other_host.is_dir() and torn.is_dir()


def test_a_claim_on_something_that_is_not_a_harness_root_is_left_alone(tmp_path, claims):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    link = tmp_path / "chaos-link"
    link.symlink_to(precious)
    _claim_file(claims, f"{scratch._pid_ns()}-{2 ** 22 + 7}-5.jsonl",
                _root(precious), _root(link),
                {"root": "relative/chaos-x", "keep": False}, {"root": "/tmp/../chaos-x", "keep": False})
    with open(next(claims.iterdir()), "a") as f:
        f.write('{"root": "/tmp/chaos-torn')  # torn by the kill: ignored
    [done] = scratch.sweep()
    assert done.removed == [] and len(done.refused) == 4, done.refused
    assert "not a harness scratch root" in done.refused[0] and "symbolic link" in done.refused[1]
    assert (precious / "keep.txt").read_text() == "mine" and link.is_symlink()


def test_a_normal_exit_drops_the_claim_file_unless_a_claimed_root_is_left(tmp_path, claims):
    code = ("import shutil, sys; from chaos import scratch; r = scratch.make_root('chaos-t-', sys.argv[1]); "
            "scratch.make_root('chaos-t-', sys.argv[1], keep=True); "
            "shutil.rmtree(r) if sys.argv[2] == 'tidy' else None")
    base = tmp_path / "base"
    base.mkdir()
    subprocess.run([sys.executable, "-c", code, str(base), "tidy"], check=True, cwd=REPO)
    assert _no_claim_files(claims), "a tidy exit left its claim file"
    subprocess.run([sys.executable, "-c", code, str(base), "messy"], check=True, cwd=REPO)
    [claim] = scratch.claims()
    assert claim.state == "gone" and len(claim.roots) == 2
    [done] = scratch.sweep()
    assert len(done.removed) == 1 and len(done.kept) == 1
    for d in base.iterdir():
        shutil.rmtree(d)


def test_a_sweep_killed_midway_is_taken_up_by_the_next(tmp_path, claims):
    root = tmp_path / "chaos-half"
    root.mkdir()
    path = _claim_file(claims, f"{scratch._pid_ns()}-{2 ** 22 + 9}-5.jsonl", _root(root))
    path.rename(f"{path}.sweeping-{2 ** 22 + 11}-3")  # its sweeper is gone too
    [done] = scratch.sweep()
    assert done.removed == [str(root)] and not root.exists() and _no_claim_files(claims)


def test_marked_under_matches_the_root_and_below_never_a_longer_name(tmp_path):
    root = str(tmp_path / "chaos-ab")
    env = dict(os.environ)
    procs = {}
    for tag, value in {"same": root, "below": root + "/point-00001#attempt0", "attempt": root + "#attempt1",
                       "longer": root + "c", "other_var": None}.items():
        e = dict(env, CHAOS_JOB_MARK=value) if value else dict(env, NOT_CHAOS=root)
        procs[tag] = subprocess.Popen(["sleep", "60"], env=e)
    try:
        found = set(marked_under(root))
        assert found == {procs[t].pid for t in ("same", "below", "attempt")}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_root_prefix_outside_the_harness_namespace_is_refused():
    with pytest.raises(ValueError, match="must start with 'chaos-'"):
        scratch.make_root("mine-")


CHAOS = [sys.executable, "-m", "chaos.cli.main"]


def _chaos_run_killed_when(ready, base: Path, claims: Path, fault: str, tmpdir: Path | None = None) -> int:
    """Start `chaos run --fault FAULT` under ``base``; SIGKILL it once ``ready()`` is truthy; its pid."""
    env = dict(os.environ, **{scratch.CLAIMS_ENV: str(claims)}, **({"TMPDIR": str(tmpdir)} if tmpdir else {}))
    run = subprocess.Popen([*CHAOS, "run", "--scratch", str(base), "--steps", "60", "--save-every", "4",
                            "--fault", fault, "--cache-dir", str(base.parent / "cache")],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        assert ready(), f"what the test waits for never appeared in the run of {fault}"
    finally:
        run.kill()
        run.wait(timeout=30)
    return run.pid


def _chaos_clean(claims: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{scratch.CLAIMS_ENV: str(claims)})
    return subprocess.run([*CHAOS, "clean"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_chaos_clean_removes_the_multiprocessing_temp_dir_of_a_sigkilled_chaos_run(tmp_path, claims):
    """The fork server's socket folder lives until the harness exits: a SIGKILL used to leave one
    ``pymp-*`` folder in the temp dir every time. It is a claimed root now (``chaos-pymp-*``)."""
    base = tmp_path / "scratch"
    base.mkdir()
    # A TMPDIR short enough for the fork server's socket (a deep one sends the folder to /tmp)
    tmp = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        def serving() -> bool:  # made just before the fork server starts, which has started once ranks log
            return any(p.name.startswith("chaos-pymp-") for p in tmp.iterdir()) and any(base.glob("*/logs/rank*"))

        pid = _chaos_run_killed_when(serving, base, claims, "rank1:step50:kill", tmpdir=tmp)
        [made] = [p for p in tmp.iterdir() if p.name.startswith("chaos-pymp-")]
        out = _chaos_clean(claims)
        assert out.returncode == 0, out.stderr
        assert f"pid {pid}" in out.stdout and str(made) in out.stdout
        assert not made.exists() and not [p for p in tmp.iterdir() if "pymp" in p.name]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.skipif(not IS_ROOT, reason="the scenario's full-disk tmpfs needs root")
def test_chaos_clean_removes_the_tmpfs_and_root_of_a_sigkilled_chaos_run(tmp_path, claims):
    """The user's story: CI's hard timeout SIGKILLs `chaos run` during its full-disk scenario."""
    base = tmp_path / "scratch"
    base.mkdir()
    pid = _chaos_run_killed_when(lambda: mounts_under(base), base, claims, "diskfull:step=3,free=4096")
    try:
        [root] = [str(p) for p in base.iterdir()]
        assert mounts_under(root), "the SIGKILL took the mount with it; nothing to test"
        out = _chaos_clean(claims)
        assert out.returncode == 0, out.stderr
        assert f"pid {pid}" in out.stdout and root in out.stdout and "1 unmounted" in out.stdout
        assert mounts_under(base) == [] and list(base.iterdir()) == []
        assert _chaos_clean(claims).stdout.startswith("nothing to clean up")
    finally:
        unmount_all(base)


@pytest.mark.skipif(not _netns_ok()[0], reason=_netns_ok()[1])
def test_chaos_clean_deletes_the_namespaces_of_a_sigkilled_chaos_run(tmp_path, claims):
    """The network family's lab (``environment``) is claimed before it is set up."""
    from faults.network import leftovers

    base = tmp_path / "scratch"
    base.mkdir()

    def lab() -> str | None:
        labs = [n for c in scratch.claims() for n in c.netns]
        return labs[0] if labs and leftovers(labs[0]) else None

    pid = _chaos_run_killed_when(lab, base, claims, "netdrop:rank=1,step=30")
    suffix = [n for c in scratch.claims() for n in c.netns][0]
    try:
        assert leftovers(suffix), "the lab went with the harness; nothing to test"
        out = _chaos_clean(claims)
        assert out.returncode == 0 and f"pid {pid}" in out.stdout, out.stdout + out.stderr
        assert "network namespace(s)/link(s) deleted" in out.stdout and leftovers(suffix) == []
    finally:
        from faults.network import remove_leftovers

        remove_leftovers(suffix)
        unmount_all(base)


@pytest.mark.skipif(not _netns_ok()[0], reason=_netns_ok()[1])
def test_job_mode_claims_each_run_chains_lab(claims):
    from chaos.nemesis import netcut

    with netcut.lab_for(2) as lab:
        assert [n for c in scratch.claims() for n in c.netns] == [lab.suffix]


SLOW_JOB = """
import json, os, sys, time
out = sys.argv[1]
p = os.path.join(out, "ckpt.json")
start = json.load(open(p))["step"] if os.path.exists(p) else 0
for step in range(start, 600):
    time.sleep(0.1)
    with open(p + ".tmp", "w") as f:
        json.dump({"step": step + 1}, f)
    os.replace(p + ".tmp", p)
"""


def test_a_users_job_orphaned_by_a_sigkilled_job_mode_harness_is_killed_by_the_next_sweep(tmp_path, claims):
    """Job mode starts the user's job in a session of its own: the harness's SIGKILL does not reach it."""
    job = tmp_path / "slow_job.py"
    job.write_text(SLOW_JOB)
    base = tmp_path / "scratch"
    base.mkdir()
    env = dict(os.environ, **{scratch.CLAIMS_ENV: str(claims)})
    run = subprocess.Popen([*CHAOS, "run", "--scratch", str(base), "--", sys.executable, str(job), "{out}"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphans: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not orphans and time.monotonic() < deadline and run.poll() is None:
            roots = list(base.iterdir())
            orphans = marked_under(str(roots[0])) if roots else []
            time.sleep(0.05)
        assert orphans, "the job never started"
    finally:
        run.kill()
        run.wait(timeout=30)
    try:
        time.sleep(0.3)
        assert [p for p in orphans if alive(p)], "the job died with its harness; nothing to test"
        out = _chaos_clean(claims)
        assert out.returncode == 0 and f"pid {run.pid}" in out.stdout and "process(es) killed" in out.stdout, out.stdout
        assert all(_wait_dead(p) for p in orphans) and list(base.iterdir()) == []
    finally:
        for p in orphans:
            if alive(p):
                os.kill(p, signal.SIGKILL)


ENGINE_HARNESS = r"""
import json, sys
from chaos import scratch
from chaos.launch.drivers.engine import PrivateEngine
root = scratch.make_root("chaos-eng-", sys.argv[1])
scratch.claim_cleanup(root, "dockerd")
engine = PrivateEngine(root).start()
print(json.dumps({"root": root, "pid": engine.pid()}), flush=True)
import time; time.sleep(600)
"""


def _engine_ok() -> tuple[bool, str]:
    from chaos.launch.drivers.engine import can_start_engine

    return can_start_engine()


@pytest.mark.skipif(not _engine_ok()[0], reason=_engine_ok()[1])
def test_the_sweep_stops_the_private_dockerd_of_a_killed_session_with_its_own_code(tmp_path, claims):
    """The plugin's engine runs detached and unmarked: only its claimed clean-up stops it."""
    from chaos.launch.drivers.engine import PrivateEngine

    base = tempfile.gettempdir()  # short: the engine's socket path must fit in a sockaddr_un
    p = subprocess.Popen([sys.executable, "-c", ENGINE_HARNESS, base], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = p.stdout.readline()
    finally:
        p.kill()
        _, err = p.communicate(timeout=30)
    if not line:
        scratch.sweep()  # a daemon that half-started is stopped all the same
        pytest.skip(f"the private engine did not start here: {err.strip()[-300:]}")
    made = json.loads(line)
    try:
        assert alive(made["pid"]), "dockerd died with the harness; nothing to test"
        [done] = scratch.sweep()
        assert done.stopped == [f"dockerd {made['root']}"] and done.refused == []
        assert _wait_dead(made["pid"]) and not os.path.exists(made["root"])
        assert "1 stopped" in done.line()
    finally:
        if os.path.isdir(made["root"]):
            PrivateEngine(made["root"]).stop()


def test_a_cleanup_that_is_not_registered_is_refused_and_never_called(tmp_path, claims):
    root = tmp_path / "chaos-x"
    root.mkdir()
    with pytest.raises(ValueError, match="registered clean-ups"):
        scratch.claim_cleanup(str(root), "os:system")
    _claim_file(claims, f"{scratch._pid_ns()}-{2 ** 22 + 13}-5.jsonl", _root(root),
                {"cleanup": "shutil:rmtree", "root": str(tmp_path / "chaos-y")},
                {"cleanup": "chaos.launch.drivers.engine:stop_engine_at", "root": str(root)})
    [done] = scratch.sweep()
    assert done.stopped == [] and done.refused == ["clean-up 'shutil:rmtree' is not a registered clean-up",
                                                   "clean-up 'chaos.launch.drivers.engine:stop_engine_at' is not a registered clean-up"]
    assert done.removed == [str(root)]
