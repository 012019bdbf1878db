"""The on-disk checkpoint format, below both the checkpointer and the storage backends.

Why a package of its own: ``chaos.reference.storage`` (the backends) and ``chaos.reference.checkpoint`` (the
reference checkpointer) both need the format — errors, hashing, the value tree, manifest
encode/parse/validation, shard read/verify and the POSIX commit primitives — and the
layering wants storage below checkpoint, never importing it back. So the format lives
here and imports neither of them. Importing this package imports nothing heavy.

Modules: ``errors`` (typed checkpoint errors), ``hashing`` (xxh3 / sha256 / crc32c),
``tree`` (state tree encoding, hostile-input checks), ``manifest`` (manifest format),
``shard`` (safetensors shard I/O with checksums), ``dtensor`` (sharded tensors: pieces,
boxes, block checksums), ``commit`` (POSIX two-phase commit), ``safeio`` (opening a
checkpoint tree's files without following links, only regular files).
"""
