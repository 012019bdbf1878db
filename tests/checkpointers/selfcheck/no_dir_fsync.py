"""Planted defect: files are fsynced but directories never are.

Shards, checksum files and ``latest.tmp`` reach stable storage, but the renames that
commit them (``step-N.tmp`` -> ``step-N``, ``latest.tmp`` -> ``latest``) live only in the
directory's page cache. After a power loss right after ``wait()`` returned, the newest
checkpoint (already acknowledged) may not exist. Otherwise this is ``correct.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _correct():
    """``correct.py`` next to this file, loaded once per process (this file is loaded by path)."""
    name = "chaos_selfcheck_correct"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "correct.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


Correct = _correct().CorrectCheckpointer


class NoDirFsyncCheckpointer(Correct):
    def _fsync_dir(self, path: str) -> None:
        pass  # the defect: fsync(file) is believed to persist its name too
