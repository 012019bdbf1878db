"""Imported once by the warm fork server, never by the harness process itself.

It pays every one-off start-up cost of a rank up front — importing torch and the
workload, and the ~2.5 s first call of ``torch.use_deterministic_algorithms`` — so a
forked rank starts training within milliseconds. The flag is switched back off here
so the fork server's state stays neutral; each rank switches it on for itself.

That first call makes torch's inductor cache directory (``$TMPDIR/torchinductor_<user>``)
and exports ``TORCHINDUCTOR_CACHE_DIR``, which every forked rank would inherit: the
fork server's TMPDIR is the harness's, outside any scenario's scratch root. So the
call gets a throw-away cache directory, removed at once, and the variable is dropped
again; a rank that needs the cache makes it under its own scratch TMPDIR.
"""

import os
import shutil
import tempfile

import torch

# The sharded modes' machinery (chaos.target.workload.parallel imports it lazily): a few hundred
# milliseconds once here instead of in every forked rank.
import torch.distributed.checkpoint.state_dict  # noqa: F401
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor.parallel  # noqa: F401

import chaos.target.workload.train  # noqa: F401 - the import is the point

_had = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
_cache = tempfile.mkdtemp(prefix="chaos-preload-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
try:
    torch.use_deterministic_algorithms(True)
    torch.use_deterministic_algorithms(False)
finally:
    if _had is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _had
    shutil.rmtree(_cache, ignore_errors=True)
