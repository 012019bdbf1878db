"""Two-phase commit of a checkpoint directory on a POSIX file system.

Layout under the root::

    step-0000000010/            committed checkpoint (manifest.json + shard-r*.safetensors)
    .tmp-step-0000000020-<id>/  a save in progress (ignored by loaders, removed later)
    latest                      "step-0000000010\\n", replaced atomically

Who calls what: every rank writes and fsyncs its own shard in the temporary directory
(phase 1). After the vote, one rank (rank 0) calls :func:`publish`: manifest written and
fsynced, the directory renamed to its final name and fsynced, then the ``latest``
pointer replaced (temp file, fsync, rename) and the parent fsynced. A directory without a
manifest was never published; the rename is the commit point. The root must be a file
system every rank sees (a shared POSIX mount or one host).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid

from chaos.phases import phase
from chaos.reference.ckptformat.errors import ManifestError
from chaos.reference.ckptformat.manifest import MANIFEST_NAME
from chaos.reference.ckptformat.safeio import open_regular, read_upto

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, so a directory named
# "step-0000000003\n" would pass for step 3.
STEP_DIR = re.compile(r"^step-(\d{1,19})\Z")
LATEST = "latest"
MAX_LATEST = 256
TEMP_PREFIXES = (".tmp-", ".old-", ".del-")


def step_dirname(step: int) -> str:
    return f"step-{step:010d}"


def tmp_dirname(step: int, nonce: str) -> str:
    return f".tmp-{step_dirname(step)}-{nonce}"


def new_nonce() -> str:
    return uuid.uuid4().hex[:12]


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_root(path: str) -> None:
    """Create the directory ``path`` and any missing parents, each entry made durable.

    A new directory's entry reaches the disk only with an fsync of its parent: a root made
    by ``os.makedirs`` alone can vanish in a power loss, with every checkpoint committed
    under it, however carefully each commit fsynced inside it. Called by the engine
    (``ReferenceCheckpointer.__init__``) on every rank. Each rank makes the same calls
    whoever wins the race to create it (a ``mkdir`` that may find it made, then an fsync
    of the parent), so two runs of a job trace the same file events on every rank.
    """
    here = os.path.abspath(path)
    parent = os.path.dirname(here)
    if parent != here and not os.path.isdir(parent):
        make_root(parent)
    try:
        os.mkdir(here)
    except FileExistsError:
        if not os.path.isdir(here):
            raise
    fsync_dir(parent)


def write_durably(path: str, data: bytes) -> None:
    """Write ``data`` to a new file and fsync it (not its directory)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def list_steps(root: str) -> list[int]:
    """Steps of the published checkpoint directories, newest first.

    Only names :func:`step_dirname` writes count: ``step-3`` next to ``step-0000000003``
    would otherwise be a second directory for the same step, and only the canonical
    one is ever read. A symbolic link with such a name is listed (so a load rejects
    it with a reason: ``chaos.reference.ckptformat.safeio`` never follows it) rather than
    silently skipped.
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    steps = [int(m.group(1)) for n in names
             if (m := STEP_DIR.match(n)) and n == step_dirname(int(m.group(1))) and os.path.isdir(os.path.join(root, n))]
    return sorted(steps, reverse=True)


def read_latest(root: str) -> int | None:
    """The step the ``latest`` pointer names, or None if absent; malformed -> ManifestError.

    The pointer is opened without following a link and must be a regular file (a FIFO
    would block the load forever); its size is checked before anything is read.
    """
    path = os.path.join(root, LATEST)
    try:
        f, st = open_regular(path, root, ManifestError)
    except FileNotFoundError:
        return None
    with f:
        if st.st_size > MAX_LATEST:
            raise ManifestError(path, f"latest pointer of {st.st_size} bytes is larger than {MAX_LATEST} bytes")
        data = read_upto(f, MAX_LATEST + 1)
    if len(data) > MAX_LATEST:
        raise ManifestError(path, f"latest pointer is larger than {MAX_LATEST} bytes")
    m = STEP_DIR.match(data.decode("utf-8", "replace").strip())
    if not m:
        raise ManifestError(path, f"latest pointer {data[:60]!r} does not name a step directory")
    return int(m.group(1))


def update_latest(root: str, step: int) -> None:
    """Atomically point ``latest`` at ``step``: temp file, fsync, rename, fsync dir."""
    tmp = os.path.join(root, f".tmp-latest-{new_nonce()}")
    write_durably(tmp, (step_dirname(step) + "\n").encode())
    os.replace(tmp, os.path.join(root, LATEST))
    fsync_dir(root)


def hide_dir(root: str, name: str) -> str:
    """First half of a deletion: rename to a hidden ``.del-`` name (atomic), fsync the parent.

    From then on no loader sees the directory, so removing its files (slow, and not
    atomic) can happen later or in the background; a crash midway never leaves a half
    checkpoint published.
    """
    hidden = os.path.join(root, f".del-{name.lstrip('.')}-{new_nonce()}")
    os.rename(os.path.join(root, name), hidden)
    fsync_dir(root)
    return hidden


def remove_dir(root: str, name: str) -> None:
    """Delete a checkpoint directory: :func:`hide_dir`, then remove its files."""
    shutil.rmtree(hide_dir(root, name), ignore_errors=True)


def publish(root: str, tmp_name: str, step: int, manifest: bytes) -> None:
    """Phase 2, on one rank: manifest, rename, then the ``latest`` pointer; durable on return.

    Four syncs, not six: the manifest's data; after the rename, the checkpoint
    directory (its entries: shards and manifest); then the pointer's data; and last the
    root, which makes both renames (directory and pointer) durable at once. A crash
    before that last sync can leave the new directory without some entries, or the
    pointer naming a directory that is not there: the save is not yet acknowledged,
    and loaders reject such a directory and fall back, so nothing acknowledged is lost.
    """
    tmp = os.path.join(root, tmp_name)
    final_name = step_dirname(step)
    final = os.path.join(root, final_name)
    phase("write_manifest", step=step)
    write_durably(os.path.join(tmp, MANIFEST_NAME), manifest)
    phase("rename", step=step)
    aside = None
    if os.path.exists(final):
        # Re-saving a step (e.g. after resuming from an older one because this step was
        # rejected): move the old directory aside; a crash between the two renames
        # leaves older checkpoints intact and loadable.
        aside = f".old-{final_name}-{new_nonce()}"
        os.rename(final, os.path.join(root, aside))
    os.rename(tmp, final)
    fsync_dir(final)
    phase("update_latest", step=step)
    update_latest(root, step)
    if aside is not None:
        shutil.rmtree(os.path.join(root, aside), ignore_errors=True)


def unpublish(root: str, step: int) -> None:
    """Undo a rename whose ``latest`` update failed, so the save commits nothing."""
    name = step_dirname(step)
    if os.path.isdir(os.path.join(root, name)):
        remove_dir(root, name)


def clean_stale(root: str, keep: str | None = None) -> list[str]:
    """Remove leftovers of crashed saves (``.tmp-``, ``.old-``, ``.del-``) except ``keep``."""
    removed = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for n in names:
        if n.startswith(TEMP_PREFIXES) and n != keep:
            p = os.path.join(root, n)
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass
            removed.append(n)
    return removed
