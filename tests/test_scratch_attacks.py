"""A local user cannot turn the scratch sweep against root (SECURITY.md, ``chaos.scratch``).

Each test plays the attack of a security review: an unprivileged user (uid 4242, run with
``setpriv --reuid=4242 --regid=4242 --clear-groups --inh-caps=-all``) prepares files in a
shared temp directory, then root runs the sweep (``chaos clean``, as every ``chaos run``
does when it makes its first root). The first group forges a claim where root's claims
used to live (``$TMPDIR/chaos-claims-0``); the second attacks root's own claims and roots
from the sides the review left: the files in them, the paths they name, the processes
they mark, a reused dockerd pid. Each asserts what the attack was after did not happen.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from chaos import scratch
from faults.disk import mount, mounts_under, unmount_all

REPO = Path(__file__).resolve().parents[1]
UID = 4242
SETPRIV = shutil.which("setpriv")
ATTACKER = [SETPRIV or "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all"]
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # the attacker's: stdlib only
CHAOS = [sys.executable, "-m", "chaos.cli.main"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                                reason="the attacks need root (the victim) and setpriv (the second uid)")


def attacker(code: str, *args: str, wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    """Run ``code`` as uid 4242 with no capabilities; its output on failure."""
    cmd = [*ATTACKER, PYTHON, "-c", code, *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the attacker's own setup failed: {done.stderr}"
    return done


def _temp_dir(prefix: str, mode: int):
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(mode)
    try:
        yield d
    finally:
        unmount_all(d)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shared():
    """A world-writable sticky directory like /tmp, readable by the attacker, gone afterwards."""
    yield from _temp_dir("chaos-attack-", 0o1777)


@pytest.fixture
def victim_dir():
    """Root's own directory outside the shared one (0755, so a link into it can be named)."""
    yield from _temp_dir("chaos-victim-", 0o755)


def _boot() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


# The attacker forges a claim of a dead owner (a pid that does not exist, this host and
# boot, root's pid namespace: all readable by anyone) in the directory root's sweep read.
FORGE = r"""
import json, os, sys
claims, entries = sys.argv[1], json.loads(sys.argv[2])
os.makedirs(claims, exist_ok=True)
os.chmod(claims, 0o777)
ns = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
owner = {"owner": {"pid": 4194000, "host": sys.argv[3], "boot": sys.argv[4], "argv": ["chaos", "run"]}}
path = os.path.join(claims, f"{ns}-4194000-5.jsonl")
with open(path, "w") as f:
    f.write("".join(json.dumps(e) + "\n" for e in [owner, *entries]))
os.chmod(path, 0o666)
"""


def forge(shared: Path, *entries: dict) -> None:
    attacker(FORGE, str(shared / "chaos-claims-0"), json.dumps(list(entries)), socket.gethostname(), _boot())


def root_sweeps(shared: Path, **env: str) -> subprocess.CompletedProcess:
    """Root runs ``chaos clean`` with the shared directory as its TMPDIR (no claims override)."""
    e = {k: v for k, v in os.environ.items() if k != scratch.CLAIMS_ENV}
    e.update(TMPDIR=str(shared), **env)
    return subprocess.run([*CHAOS, "clean"], cwd=REPO, env=e, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- forged claims in a shared TMPDIR

def test_a_forged_claim_in_the_shared_temp_dir_runs_no_code_as_root(shared):
    """Review finding 1: a clean-up ``chaos.reference.storage:load_wrapper`` on a root that names the
    attacker's ``chaos-evil.py`` imported it as uid 0."""
    (shared / "x").mkdir(mode=0o777)
    os.chmod(shared / "x", 0o777)
    pwned = shared / "PWNED"
    attacker("import sys; open(sys.argv[1], 'w').write("
             "'import os\\nopen(%r, \"w\").write(str(os.getuid()))\\nclass X: pass\\n' % sys.argv[2])",
             str(shared / "x" / "chaos-evil.py"), str(pwned))
    spec = f"{shared}/x/chaos-evil.py:X"
    forge(shared, {"cleanup": "chaos.reference.storage:load_wrapper", "root": spec},
          {"cleanup": "chaos.target.protocol:load_checkpointer", "root": spec})
    out = root_sweeps(shared)
    assert not pwned.exists(), f"the attacker's code ran as uid {pwned.read_text()}: {out.stdout}{out.stderr}"


def test_a_forged_claim_deletes_nothing_of_roots_not_through_a_link_nor_anywhere(shared, victim_dir):
    """Finding 2: ``{"root": "/any/where/chaos-important"}`` deleted it; ``/tmp/x/lnk/chaos-t``
    with ``lnk -> /elsewhere`` deleted ``/elsewhere/chaos-t``."""
    important, through = victim_dir / "chaos-important", victim_dir / "chaos-t"
    for d in (important, through):
        d.mkdir()
        (d / "data").write_text("root's")
    attacker("import os, sys; os.makedirs(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1] + '/lnk')",
             str(shared / "x"), str(victim_dir))
    forge(shared, {"root": str(important), "keep": False}, {"root": f"{shared}/x/lnk/chaos-t", "keep": False})
    out = root_sweeps(shared)
    assert (important / "data").read_text() == "root's", out.stdout
    assert (through / "data").read_text() == "root's", "the sweep followed the attacker's link"


def test_a_forged_keep_claim_kills_no_process(shared, victim_dir):
    """Finding 2: ``{"root": R, "keep": true}`` SIGKILLed every process whose ``CHAOS_*`` value
    lies under R: a live harness's ranks, a shell with ``CHAOS_CLAIMS_DIR`` exported."""
    live = victim_dir / "chaos-live"
    live.mkdir()
    rank = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CHAOS_SCENARIO=f"{live}/s1"))
    shell = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CHAOS_CLAIMS_DIR=str(live)))
    try:
        forge(shared, {"root": str(live), "keep": True})
        root_sweeps(shared)
        time.sleep(0.2)
        assert rank.poll() is None and shell.poll() is None, "the forged claim killed root's processes"
    finally:
        for p in (rank, shell):
            p.kill()
            p.wait()


SIGTERM_RECORDER = r"""
import os, signal, sys, time
def on_term(*_):
    open(sys.argv[1], "w").write("SIGTERM")
signal.signal(signal.SIGTERM, on_term)
print(os.getpid(), flush=True)
time.sleep(120)
"""


def test_a_forged_dockerd_pidfile_signals_no_process(shared):
    """Finding 2: a clean-up ``chaos.launch.drivers.engine:stop_engine_at`` on R with ``R/dockerd.pid``
    holding any pid SIGTERMed it."""
    got = shared / "victim-got"
    victim = subprocess.Popen([sys.executable, "-c", SIGTERM_RECORDER, str(got)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(victim.stdout.readline())
        attacker("import os, sys; os.makedirs(sys.argv[1]); open(sys.argv[1] + '/dockerd.pid', 'w').write(sys.argv[2])",
                 str(shared / "chaos-eng"), str(pid))
        forge(shared, {"cleanup": "chaos.launch.drivers.engine:stop_engine_at", "root": str(shared / "chaos-eng")})
        root_sweeps(shared)
        assert not got.exists() and victim.poll() is None, "root's process was signalled"
    finally:
        victim.kill()
        victim.wait()


SWAPPER = r"""
import os, signal, sys, time
root, target = sys.argv[1], sys.argv[2]
def swap(*_):  # the sweep waits for this process to die: swap the root for a link meanwhile
    os.rename(root, root + ".old")
    os.symlink(target, root)
signal.signal(signal.SIGTERM, swap)
os.makedirs(root)
with open(root + "/dockerd.pid", "w") as f:
    f.write(str(os.getpid()))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_forged_cleanup_cannot_unmount_root_s_file_systems_by_a_swap_during_its_wait(shared, victim_dir):
    """Finding 3: a ``dockerd.pid`` naming a process that ignores SIGTERM made the sweep wait
    20 s; swapping R for a link meanwhile unmounted what lay under the link's target."""
    (victim_dir / "mnt").mkdir()
    mount("tmpfs", str(victim_dir / "mnt"), "tmpfs", 0, "size=1m")
    root = shared / "x" / "chaos-r"
    attacker("import os, sys; os.makedirs(sys.argv[1], mode=0o777)", str(shared / "x"))
    swapper = attacker(SWAPPER, str(root), str(victim_dir), wait=False)
    try:
        assert swapper.stdout.readline().strip() == "ready"
        forge(shared, {"cleanup": "chaos.launch.drivers.engine:stop_engine_at", "root": str(root)})
        root_sweeps(shared)
        assert mounts_under(victim_dir / "mnt") == [str(victim_dir / "mnt")], "root's tmpfs was unmounted"
    finally:
        swapper.kill()
        swapper.wait()


# ---------------------------------------------------------------- root's own claims directory and roots

def test_a_claims_directory_another_user_made_is_refused_with_one_line_and_never_read(shared):
    """``CHAOS_CLAIMS_DIR`` (or a non-root user's default in a shared TMPDIR) pointing at a
    directory the attacker made: refused, never used, never swept."""
    (shared / "x").mkdir(mode=0o777)
    os.chmod(shared / "x", 0o777)
    pwned = shared / "PWNED"
    attacker("import sys; open(sys.argv[1], 'w').write('open(%r, \"w\").write(\"x\")\\nclass X: pass\\n' % sys.argv[2])",
             str(shared / "x" / "chaos-evil.py"), str(pwned))
    forge(shared, {"cleanup": "chaos.target.protocol:load_checkpointer", "root": f"{shared}/x/chaos-evil.py:X"})
    claims = shared / "chaos-claims-0"
    out = root_sweeps(shared, **{scratch.CLAIMS_ENV: str(claims)})
    assert out.returncode == 2 and not pwned.exists(), out.stdout + out.stderr
    [line] = out.stdout.strip().splitlines()
    assert "refusing the claims directory" in line and str(claims) in line and f"uid {UID}" in line
    # a harness that would claim there says so once and goes on unclaimed
    e = dict(os.environ, **{scratch.CLAIMS_ENV: str(claims)})
    made = subprocess.run([sys.executable, "-c", "from chaos import scratch; import shutil, sys; "
                           "r = scratch.make_root('chaos-t-', sys.argv[1]); scratch.make_root('chaos-t-', sys.argv[1]); "
                           "print(r)", str(shared)], cwd=REPO, env=e, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stderr.count("refusing the claims directory") == 1 and not pwned.exists()
    assert sorted(os.listdir(claims)) == [f"{scratch._pid_ns()}-4194000-5.jsonl"], "root wrote into the attacker's directory"


def test_a_group_writable_claims_directory_is_refused(tmp_path, monkeypatch):
    claims = tmp_path / "claims"
    claims.mkdir()
    claims.chmod(0o777)
    monkeypatch.setenv(scratch.CLAIMS_ENV, str(claims))
    with pytest.raises(scratch.UnsafeClaims, match="writable by group or others"):
        scratch.sweep()


def _root_entry(path: Path, keep: bool = False, since: int | None = None) -> dict:
    st = os.lstat(path)
    return {"root": str(path), "keep": keep, "dev": st.st_dev, "ino": st.st_ino,
            "since": scratch.now_ticks() if since is None else since}


def _own_claim(claims: Path, *entries: dict) -> Path:
    """A claim file of a dead owner in root's private claims directory."""
    claims.mkdir(mode=0o700, exist_ok=True)
    path = claims / f"{scratch._pid_ns()}-{2 ** 22 + 77}-5.jsonl"
    head = {"owner": {"pid": 2 ** 22 + 77, "argv": ["chaos"], "host": scratch._host(), "boot": scratch._boot_id()}}
    path.write_text("".join(json.dumps(e) + "\n" for e in [head, *entries]))
    return path


def test_a_claim_file_of_another_owner_is_never_read(tmp_path, claims):
    root = tmp_path / "chaos-r"
    root.mkdir()
    path = _own_claim(claims, _root_entry(root))
    os.chown(path, UID, UID)
    [claim] = scratch.claims()
    assert claim.state == "untrusted" and f"uid {UID}" in claim.why
    assert scratch.sweep() == [] and root.is_dir()


def test_a_root_replaced_by_another_directory_or_reached_through_a_link_is_left_alone(tmp_path, claims, victim_dir):
    replaced, elsewhere = tmp_path / "chaos-replaced", victim_dir / "chaos-t"
    replaced.mkdir()
    entry = _root_entry(replaced)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data").write_text("not the claimed one")
    replaced.rmdir()
    (tmp_path / "other").rename(replaced)  # same name, another directory
    elsewhere.mkdir()
    (elsewhere / "data").write_text("root's")
    (tmp_path / "lnk").symlink_to(victim_dir)
    through = _root_entry(elsewhere)
    through["root"] = str(tmp_path / "lnk" / "chaos-t")  # even with the identity right
    _own_claim(claims, entry, through)
    [done] = scratch.sweep()
    assert done.removed == [] and len(done.refused) == 2, done.refused
    assert "another one is there now" in done.refused[0] and "symbolic link" in done.refused[1]
    assert (replaced / "data").exists() and (elsewhere / "data").read_text() == "root's"


def test_the_sweep_kills_only_this_users_processes_marked_with_the_root_and_started_after_it(tmp_path, claims):
    root = tmp_path / "chaos-r"
    root.mkdir()
    before = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CHAOS_JOB_MARK=f"{root}/p#attempt0"))
    time.sleep(0.05)
    entry = _root_entry(root, keep=True)
    time.sleep(0.05)
    not_a_mark = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CHAOS_CLAIMS_DIR=str(root)))
    theirs = subprocess.Popen([*ATTACKER, "sleep", "120"], env=dict(os.environ, CHAOS_SCENARIO=f"{root}/s"))
    ours = subprocess.Popen(["sleep", "120"], env=dict(os.environ, CHAOS_SCENARIO=f"{root}/s"))
    procs = (before, not_a_mark, theirs, ours)
    try:
        time.sleep(0.2)  # setpriv has exec'd sleep
        _own_claim(claims, entry)
        [done] = scratch.sweep()
        assert done.killed == [ours.pid] and done.kept == [str(root)]
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert all(p.poll() is None for p in (before, not_a_mark, theirs))
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_dockerd_cleanup_signals_only_a_dockerd_of_this_root(tmp_path, claims):
    """A pidfile outlives its daemon: the pid it names may be anyone's now."""
    root = Path(scratch.make_root("chaos-eng-", str(tmp_path)))
    got = tmp_path / "got"
    other = subprocess.Popen([*ATTACKER, PYTHON, "-c", SIGTERM_RECORDER, "/dev/null"], stdout=subprocess.PIPE, text=True)
    mine = subprocess.Popen([sys.executable, "-c", SIGTERM_RECORDER, str(got)], stdout=subprocess.PIPE, text=True)
    try:
        int(other.stdout.readline())
        (root / "dockerd.pid").write_text(mine.stdout.readline().strip())
        path = _own_claim(claims, _root_entry(root), {"cleanup": "dockerd", "root": str(root)})
        assert path.exists()
        [done] = scratch.sweep()
        assert done.stopped == [f"dockerd {root}"] and done.removed == [str(root)]
        time.sleep(0.2)
        assert not got.exists() and mine.poll() is None and other.poll() is None
        from chaos.launch.drivers.engine import PrivateEngine

        (root.parent / "chaos-eng-pid").mkdir()
        (root.parent / "chaos-eng-pid" / "dockerd.pid").write_text(str(other.pid))
        assert PrivateEngine(root.parent / "chaos-eng-pid").pid() is None
    finally:
        for p in (other, mine):
            p.kill()
            p.wait()


def test_a_scratch_base_another_user_can_change_is_refused(shared):
    from chaos.errors import ConfigError

    attacker("import os, sys; os.makedirs(sys.argv[1])", str(shared / "theirs"))
    with pytest.raises(ConfigError, match=f"belongs to uid {UID}"):
        scratch.make_root("chaos-t-", str(shared / "theirs"))
    assert os.listdir(shared / "theirs") == []


def test_the_engine_refuses_a_root_another_user_made_first(shared):
    from chaos.launch.drivers.engine import EngineUnavailable, PrivateEngine, can_start_engine

    if not can_start_engine()[0]:
        pytest.skip(can_start_engine()[1])
    attacker("import os, sys; os.makedirs(sys.argv[1]); open(sys.argv[1] + '/daemon.json', 'w').write('{}')",
             str(shared / "chaos-engine"))
    with pytest.raises(EngineUnavailable, match=f"belongs to uid {UID}"):
        PrivateEngine(shared / "chaos-engine").start()
    assert sorted(os.listdir(shared / "chaos-engine")) == ["daemon.json"]
    st = os.stat(shared / "chaos-engine" / "daemon.json")
    assert st.st_uid == UID and not stat.S_ISLNK(st.st_mode)



def test_root_claims_in_its_own_directory_under_run_not_in_the_shared_temp_dir(shared):
    """Without ``CHAOS_CLAIMS_DIR``, root's claims live where no other user can create them."""
    e = {k: v for k, v in os.environ.items() if k != scratch.CLAIMS_ENV}
    e["TMPDIR"] = str(shared)
    code = ("from chaos import scratch; import os, shutil, sys; r = scratch.make_root('chaos-t-'); "
            "print(scratch.claims_dir()); print(os.path.basename(scratch.own().path)); shutil.rmtree(r)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    directory, name = out.stdout.split()
    assert directory == "/run/chaos-claims-0" and not (shared / "chaos-claims-0").exists()
    st = os.lstat(directory)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert not os.path.exists(os.path.join(directory, name)), "a tidy exit left its claim file"
