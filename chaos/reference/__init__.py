"""The reference checkpointer, apart from the harness: reached by the harness only through the
checkpointer protocol (``chaos.target.protocol``), and importing nothing of the harness.

checkpoint/   the engine: saver, planner, loader, resharding, async writer, policy, metrics
ckptformat/   the on-disk format: manifest, shards, hashing, two-phase commit, safe reads
storage/      backends by URL: POSIX, S3 (conditional commit), any fsspec file system
"""
