"""Hostile checkpoint trees on POSIX: every reader ends in one typed error or a fallback,
in bounded time and memory.

A checkpoint directory this run did not write is hostile input. Hypothesis takes a real
checkpoint root (steps 1 and 2, written by the reference checkpointer) and spoils it one
way per example: a symbolic link out of the root (step directory, manifest, shard,
``latest``), a FIFO (an ``open`` for reading blocks until a writer comes: forever), a
directory nested many levels deep where a file belongs, a sparse shard that claims
hundreds of megabytes, a declared size of terabytes, control characters in names, a
shard name that walks out of its directory, a pickle where a safetensors shard belongs.

Judged by outcomes: reading step 2 directly raises a :class:`CheckpointError` whose
``file`` is the spoiled path and whose message says what is wrong; ``load_latest`` loads
an older committed step (or, when only the pointer was spoiled, the newest intact one)
bit for bit; nothing blocks (each call runs in a thread with a deadline, and a FIFO
that holds it is released so the test fails instead of hanging); and neither the Python
heap (tracemalloc) nor the process's resident memory grows with the hostile size.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import stat
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.checkpoint.loader import load_step
from chaos.reference.ckptformat import commit
from chaos.reference.ckptformat.errors import CheckpointError
from chaos.reference.ckptformat.hashing import digest
from chaos.reference.ckptformat.manifest import MANIFEST_NAME, encode_manifest

S1, S2 = commit.step_dirname(1), commit.step_dirname(2)
SHARD = "shard-r00000.safetensors"
MAX_MANIFEST = 1 << 20
DEADLINE_S = 20.0  # a load of this checkpoint takes well under a second
HEAP_LIMIT = 32 << 20  # Python heap peak during one call
RSS_LIMIT = 128 << 20  # resident memory growth during one call; hostile sizes are >= 384 MiB
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or not hasattr(os, "O_NOFOLLOW"), reason="POSIX only")


def state(step: int) -> dict:
    # 256 KiB of "w": large enough for the in-place load path (loader.IN_PLACE_MIN_BYTES).
    return {"model": {"w": torch.arange(65536, dtype=torch.float32).reshape(256, 256) + step, "b": torch.ones(8) * step},
            "optimizer": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "progress": {"step": step}}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    c = ReferenceCheckpointer(str(root), 0, 1, metrics=False)
    c.save(1, state(1))
    c.save(2, state(2))
    c.close()
    assert commit.list_steps(str(root)) == [2, 1]
    return root


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


# -- bounded calls ------------------------------------------------------------------

def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> int | None:
    """Reset the kernel's resident high-water mark (``VmHWM``) to now; None where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_kib("VmHWM")


def _release_fifos(root: Path) -> None:
    """Open every FIFO under ``root`` for writing and close it: a reader blocked in open() gets EOF."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                if stat.S_ISFIFO(os.lstat(p).st_mode):
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


@dataclass
class Bounded:
    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    heap_peak: int = 0
    rss_growth: int | None = None


def bounded(fn: Callable[[], Any], root: Path, what: str, heap_limit: int | None = HEAP_LIMIT) -> Bounded:
    """Run ``fn`` in a thread under a deadline, measuring heap peak and resident growth.

    A call still running at the deadline fails the test: the FIFOs under ``root`` are
    released first, so the thread (and the test run) can finish. ``heap_limit`` None:
    no heap bound (an in-process server's own allocations would count).
    """
    out = Bounded()

    def run() -> None:
        try:
            out.value = fn()
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            out.error = exc

    tracemalloc.start()
    base = _reset_peak_rss()
    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True, name=f"hostile-{what}")
    t.start()
    t.join(DEADLINE_S)
    hung = t.is_alive()
    for _ in range(100):
        if not t.is_alive():
            break
        _release_fifos(root)
        t.join(0.1)
    out.seconds = time.monotonic() - start
    out.heap_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    hwm = _status_kib("VmHWM")
    out.rss_growth = hwm - base if base is not None and hwm is not None else None
    assert not hung, f"{what} was still running after {DEADLINE_S}s (blocked on a FIFO?)"
    assert heap_limit is None or out.heap_peak < heap_limit, f"{what}: Python heap peaked at {out.heap_peak} bytes"
    assert heap_limit is None or out.rss_growth is None or out.rss_growth < RSS_LIMIT, \
        f"{what}: resident memory grew by {out.rss_growth} bytes"
    return out


# -- spoiling a tree ----------------------------------------------------------------

@dataclass
class Expect:
    """What a spoiled tree must produce."""

    step_error: tuple[str, str] | None = None  # load_step(2): (file, regex of the problem)
    latest_error: tuple[str, str] | None = None  # read_latest: (file, regex)
    loads: int = 1  # the step load_latest returns
    listed: bool = True  # step 2 is still listed, so load_latest records why it rejected it
    after: list[Callable[[], None]] = field(default_factory=list)


def _edit_manifest(d: Path, edit: Callable[[dict], None]) -> None:
    m = json.loads((d / MANIFEST_NAME).read_bytes())
    edit(m)
    (d / MANIFEST_NAME).write_bytes(encode_manifest(m))


def _rename_shard(m: dict, new: str) -> None:
    m["shards"][new] = m["shards"].pop(SHARD)
    for e in m["entries"].values():
        e["shard"] = new


def _link(target: Path, at: Path, relative: bool) -> None:
    os.symlink(os.path.relpath(target, at.parent) if relative else str(target), at)


def _replace_with_tree(at: Path, depth: int) -> None:
    """``at`` becomes a directory nested ``depth`` levels deep, a file at each level."""
    if at.is_dir():
        shutil.rmtree(at)
    else:
        at.unlink()
    d = at
    for i in range(depth):
        d.mkdir()
        (d / f"f{i}").write_bytes(b"x")
        d = d / "d"


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def symlink_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    target = data.draw(st.sampled_from(["step", "manifest", "shard", "latest"]), label="target")
    relative = data.draw(st.booleans(), label="relative link")
    step = root / S2
    if target == "step":
        shutil.move(step, outside / S2)
        _link(outside / S2, step, relative)
        return Expect(step_error=(str(step), "symbolic link"))
    if target == "latest":
        (outside / "latest").write_text(commit.step_dirname(1) + "\n")
        (root / "latest").unlink()
        _link(outside / "latest", root / "latest", relative)
        return Expect(latest_error=(str(root / "latest"), "symbolic link"), loads=2)
    name = MANIFEST_NAME if target == "manifest" else SHARD
    shutil.move(step / name, outside / name)  # a faithful copy: following the link would load it
    _link(outside / name, step / name, relative)
    return Expect(step_error=(str(step / name), "symbolic link"))


def fifo_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    target = data.draw(st.sampled_from(["manifest", "shard", "latest", "step"]), label="target")
    if target == "latest":
        (root / "latest").unlink()
        os.mkfifo(root / "latest")
        return Expect(latest_error=(str(root / "latest"), "FIFO"), loads=2)
    if target == "step":
        shutil.rmtree(root / S2)
        os.mkfifo(root / S2)
        return Expect(step_error=(str(root / S2), "FIFO"), listed=False)
    path = root / S2 / (MANIFEST_NAME if target == "manifest" else SHARD)
    path.unlink()
    os.mkfifo(path)
    return Expect(step_error=(str(path), "FIFO"))


def directory_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    target = data.draw(st.sampled_from(["manifest", "shard", "latest"]), label="target")
    depth = data.draw(st.integers(1, 64), label="depth")
    if target == "latest":
        _replace_with_tree(root / "latest", depth)
        return Expect(latest_error=(str(root / "latest"), "directory"), loads=2)
    path = root / S2 / (MANIFEST_NAME if target == "manifest" else SHARD)
    _replace_with_tree(path, depth)
    return Expect(step_error=(str(path), "directory"))


def sparse_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    size = data.draw(st.sampled_from([384 * MiB, 512 * MiB, 768 * MiB]), label="size")
    target = data.draw(st.sampled_from(["shard", "shard with its header", "manifest"]), label="target")
    step = root / S2
    if target == "manifest":
        _sparse(step / MANIFEST_NAME, size)
        return Expect(step_error=(str(step / MANIFEST_NAME), "exceeds the"))
    head = (step / SHARD).read_bytes() if target == "shard with its header" else b""
    _edit_manifest(step, lambda m: m["shards"][SHARD].update(size=size))
    _sparse(step / SHARD, size, head)
    return Expect(step_error=(str(step / SHARD), "checksum mismatch|safetensors header"))


def _memory_and_swap() -> int:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "SwapTotal") if k in fields)
    except (OSError, ValueError):
        return 0


def huge_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    # Terabytes, and always more than this machine's memory and swap.
    size = max(data.draw(st.sampled_from([1 << 40, 1 << 42, 1 << 43]), label="declared size"), 2 * _memory_and_swap())
    step = root / S2
    _edit_manifest(step, lambda m: m["shards"][SHARD].update(size=size))
    _sparse(step / SHARD, size, (step / SHARD).read_bytes())
    return Expect(step_error=(str(step / SHARD), "memory"))


CONTROL = ["\n", "\r\n", "\t", "\x1b[0m", "\x7f", "\x85", "\u2028"]


def control_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    where = data.draw(st.sampled_from(["shard", "step"]), label="where")
    ctrl = data.draw(st.sampled_from(CONTROL), label="control")
    step = root / S2
    if where == "shard":
        at = data.draw(st.sampled_from([len(SHARD), 0, 5]), label="position")
        name = SHARD[:at] + ctrl + SHARD[at:]
        shutil.copyfile(step / SHARD, step / name)  # the name the manifest gives exists, a faithful copy
        _edit_manifest(step, lambda m: _rename_shard(m, name))
        return Expect(step_error=(str(step / MANIFEST_NAME), "not an allowed file name"))
    # A directory whose name only looks like step 3 ("step-0000000003\n", or the
    # non-canonical "step-3"), with ``latest`` pointing at step 3.
    odd = data.draw(st.sampled_from([commit.step_dirname(3) + ctrl, "step-3"]), label="directory name")
    shutil.copytree(step, root / odd)
    _edit_manifest(root / odd, lambda m: m.update(step=3))
    (root / "latest").write_text(commit.step_dirname(3) + "\n")

    def never_listed() -> None:
        assert 3 not in commit.list_steps(str(root)), f"{odd!r} was listed as step 3"

    return Expect(loads=2, after=[never_listed])


def traversal_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    shutil.copyfile(root / S2 / SHARD, outside / SHARD)
    name = data.draw(st.sampled_from([f"../../{outside.name}/{SHARD}", str(outside / SHARD), f"../{S1}/{SHARD}",
                                      f"sub/{SHARD}", "..", ".", "C:" + SHARD]), label="name")
    _edit_manifest(root / S2, lambda m: _rename_shard(m, name))
    return Expect(step_error=(str(root / S2 / MANIFEST_NAME), "path traversal|absolute path|not an allowed file name"))


class _Marker:
    """Unpickling this creates ``path``: proof that a loader ran a pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.open, (self.path, os.O_CREAT | os.O_WRONLY, 0o600))


def pickle_attack(root: Path, outside: Path, data: st.DataObject) -> Expect:
    fmt = data.draw(st.sampled_from(["pickle", "torchzip"]), label="format")
    protocol = data.draw(st.integers(2, pickle.HIGHEST_PROTOCOL), label="protocol")
    marker = outside / "unpickled"
    payload = {"model": {"w": _Marker(str(marker))}}
    if fmt == "pickle":
        blob = pickle.dumps(payload, protocol=protocol)
    else:
        buf = io.BytesIO()
        torch.save(payload, buf, pickle_protocol=protocol)
        blob = buf.getvalue()
    step = root / S2
    size = (step / SHARD).stat().st_size
    blob = blob + b"\0" * max(0, size - len(blob))  # pickle.load stops at STOP; the size now matches
    (step / SHARD).write_bytes(blob)
    _edit_manifest(step, lambda m: m["shards"][SHARD].update(size=len(blob), checksum=digest(m["hash"], blob)))

    def never_unpickled() -> None:
        assert not marker.exists(), "a loader unpickled the shard"

    return Expect(step_error=(str(step / SHARD), "safetensors header"), after=[never_unpickled])


ATTACKS = {
    "symlink": symlink_attack, "fifo": fifo_attack, "nested directory": directory_attack, "sparse": sparse_attack,
    "huge declared size": huge_attack, "control characters": control_attack, "path traversal": traversal_attack,
    "pickle": pickle_attack,
}


def _typed(result: Bounded, expected: tuple[str, str], what: str) -> None:
    exc = result.error
    assert isinstance(exc, CheckpointError), f"{what}: expected a typed CheckpointError, got {exc!r}"
    file, problem = expected
    assert getattr(exc, "file", None) == file, f"{what}: error names {getattr(exc, 'file', None)!r}, not {file!r}: {exc}"
    assert re.search(problem, str(exc)), f"{what}: {exc} does not say {problem!r}"


@pytest.mark.parametrize("attack", sorted(ATTACKS))
# No shrinking: every example is already small, and a reader that blocks would make
# each shrink step wait out the deadline again.
@settings(max_examples=15, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), verify=st.booleans(), in_place=st.booleans())
def test_a_hostile_tree_gives_one_typed_error_or_a_fallback(pristine, scratch, attack, data, verify, in_place):
    work = Path(tempfile.mkdtemp(dir=scratch))
    try:
        root, outside = work / "ckpt", work / "elsewhere"
        shutil.copytree(pristine, root)
        outside.mkdir()
        expect = ATTACKS[attack](root, outside, data)

        if expect.step_error is not None:
            got = bounded(lambda: load_step(str(root), 2, state(0), 0, 1, verify, MAX_MANIFEST, in_place), root,
                          "load_step")
            _typed(got, expect.step_error, "load_step")
        if expect.latest_error is not None:
            got = bounded(lambda: commit.read_latest(str(root)), root, "read_latest")
            _typed(got, expect.latest_error, "read_latest")

        def load_latest() -> tuple[Any, list]:
            c = ReferenceCheckpointer(str(root), 0, 1, verify=verify, load_in_place=in_place, metrics=False,
                                      max_manifest_bytes=MAX_MANIFEST)
            try:
                return c.load_latest(state(0)), c.events
            finally:
                c.close()

        got = bounded(load_latest, root, "load_latest")
        assert got.error is None, f"load_latest raised {got.error!r}"
        (step, loaded), events = got.value
        assert step == expect.loads and fingerprint(loaded) == fingerprint(state(expect.loads))
        if expect.step_error is not None and expect.listed:
            rejects = [e["reason"] for e in events if e["kind"] == "load_reject" and e.get("step") == 2]
            assert rejects and re.search(expect.step_error[1], rejects[0]), rejects
        for check in expect.after:
            check()
    finally:
        _release_fifos(work)
        shutil.rmtree(work, ignore_errors=True)
