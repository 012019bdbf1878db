"""Asynchronous replication of committed checkpoints to a second backend (off-site backup).

Why this shape: a replica is only worth having if it is itself a valid checkpoint, so it
is written through the destination backend's *own* commit protocol (temp location or
data prefix, then its commit point) — a crash mid-replication leaves nothing visible
there — and then read back from the destination with checksum verification against
the manifest, before it is reported as replicated. The source is read verified too, so
a checkpoint that rotted at the source is never copied as good. Rank 0 runs this in a
background thread after the commit; a failure is an event and a log line, never a
failed save.
"""

from __future__ import annotations

import time
from typing import Any

from chaos.reference.ckptformat import commit, manifest
from chaos.reference.ckptformat.errors import ManifestError


def replicate_step(src: Any, dst: Any, step: int, max_manifest_bytes: int = 256 * 1024 * 1024) -> dict[str, Any]:
    """Copy committed ``step`` from ``src`` to ``dst``, commit it there, verify it there."""
    t = time.perf_counter()
    m, _ = src.read_manifest(step, max_manifest_bytes)
    algorithm = m["hash"]
    already = step in dst.list_steps()
    nbytes = 0
    if not already:
        tmp_name = commit.tmp_dirname(step, commit.new_nonce())
        try:
            for name, spec in sorted(m["shards"].items()):
                shard = src.read_shard(step, name, spec, algorithm, True)  # verified at the source
                data = memoryview(shard.buffer.numpy()).cast("B")
                with dst.create_shard(tmp_name, name) as f:
                    f.write(data)
                    dst.durable(f)
                nbytes += len(data)
            dst.publish(tmp_name, step, manifest.encode_manifest(m))
        except BaseException:
            dst.roll_back(step, tmp_name, None)
            raise
    # Verified there: the destination's manifest and every shard against its checksum.
    m2, _ = dst.read_manifest(step, max_manifest_bytes)
    if m2["shards"] != m["shards"]:
        raise ManifestError(getattr(dst, "url", "?"), f"replica of step {step} has a different shard table")
    for name, spec in sorted(m2["shards"].items()):
        dst.read_shard(step, name, spec, algorithm, True)
    return {"step": step, "target": getattr(dst, "url", "?"), "bytes": nbytes, "already_present": already,
            "verified_shards": len(m2["shards"]), "seconds": round(time.perf_counter() - t, 3)}
