"""What is being certified: a backend URL (or ``s3-local``), optionally wrapped.

Why a separate object: every property needs fresh, isolated locations on the same
backend (a subdirectory or key prefix per check), URLs that route through a fault
proxy, and a way to list leftovers — independent of the checkpointer under test.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

from chaos.reference.storage.base import StorageConfigError, parse_url


@dataclass
class Target:
    spec: str
    kind: str  # posix | s3 | fsspec
    base: str  # file: directory; s3 and fsspec: URL without query
    params: dict[str, str] = field(default_factory=dict)
    wrapper: str | None = None
    local_s3: Any = None
    remount: list[str] | None = None  # --remount: how to mount a FUSE target again after its client crashed
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def location(self) -> str:
        return self.base

    def url(self, sub: str, endpoint: str | None = None, **params: Any) -> str:
        """A URL for a fresh location ``sub`` of this certification run."""
        if self.kind == "posix":
            return "file://" + os.path.join(self.base, f"certify-{self.run_id}", sub)
        if self.kind == "fsspec":
            query = "?" + urllib.parse.urlencode(self.params) if self.params else ""
            return f"{self.base.rstrip('/')}/certify-{self.run_id}/{sub}{query}"
        q = dict(self.params)
        if endpoint:
            q["endpoint_url"] = endpoint
        q.update({k: str(v) for k, v in params.items()})
        return f"{self.base.rstrip('/')}/certify-{self.run_id}/{sub}?" + urllib.parse.urlencode(q, safe=":/")

    def mount(self) -> dict[str, Any] | None:
        """What a POSIX target is mounted on, for the report and the findings table; None for object stores.

        From ``/proc/self/mountinfo`` (never guessed from the path): mount point, fs type,
        source, options (per-mount then the file system's own), and for a FUSE mount the
        program serving it (its command's base name only: its arguments may hold secrets).
        """
        if self.kind != "posix":
            return None
        from faults.disk import mount_of
        from faults.errors import Unsupported
        from faults.fusemount import find_daemon, is_fuse

        m = mount_of(self.base)
        if m is None:
            return None
        client = None
        if is_fuse(m["fstype"]):
            try:
                client = os.path.basename(find_daemon(self.base).argv[0])
            except Unsupported:
                client = None
        return {"mount_point": m["mount_point"], "fstype": m["fstype"], "source": m["source"],
                "options": m["options"].split(",") if m["options"] else [], "client": client}

    def endpoint_hostport(self) -> tuple[str, int]:
        ep = urllib.parse.urlsplit(self.params.get("endpoint_url", ""))
        if not ep.hostname or not ep.port:
            raise StorageConfigError(f"backend {self.spec!r}: the fault proxy needs an explicit endpoint_url host:port")
        return ep.hostname, ep.port

    def _object_store(self, sub: str) -> Any:
        """The typed backend for ``sub`` (S3Storage or FsspecStorage), so its helpers always exist."""
        if self.kind == "s3":
            from chaos.reference.storage.s3 import S3Storage

            return S3Storage(parse_url(self.url(sub)))
        from chaos.reference.storage.fsspec_store import FsspecStorage

        return FsspecStorage(parse_url(self.url(sub)))

    def leftovers(self, sub: str) -> dict[str, list[str]]:
        """Temp dirs / uncommitted data / uncompleted uploads under ``sub`` (for orphan_cleanup)."""
        if self.kind == "posix":
            root = parse_url(self.url(sub)).location
            names = os.listdir(root) if os.path.isdir(root) else []
            return {"temp_entries": sorted(n for n in names if n.startswith((".tmp-", ".old-", ".del-")))}
        st = self._object_store(sub)
        try:
            out = {"unreferenced_data": st.unreferenced_data()}
            if self.kind == "s3":
                out["uncompleted_uploads"] = st.uncompleted_uploads()
            return out
        finally:
            st.close()

    def remove_run(self) -> None:
        """Delete everything this certification run wrote on the backend (raises on failure)."""
        if self.kind == "posix":
            run_dir = os.path.join(self.base, f"certify-{self.run_id}")
            if os.path.isdir(run_dir):
                shutil.rmtree(run_dir)
            return
        st = self._object_store("")
        try:
            if self.kind == "s3":
                st._abort_uploads(st.prefix)
                st._delete_keys([o["Key"] for o in st._list(st.prefix)])
            elif st.fs.exists(st.base):
                st.fs.rm(st.base, recursive=True)
        finally:
            st.close()


def resolve(spec: str, wrapper: str | None = None, scratch: str | None = None) -> Target:
    """``s3-local`` (starts the embedded server; caller stops ``target.local_s3``), or a URL."""
    if spec == "s3-local":
        from chaos.certify.local_s3 import LocalS3

        s3 = LocalS3().start()
        return Target(spec, "s3", f"s3://{s3.bucket}", {"endpoint_url": s3.endpoint, "part_size": str(5 << 20)},
                      wrapper, local_s3=s3)
    u = parse_url(spec)
    if u.scheme == "file":
        if not os.path.isdir(u.location):
            raise StorageConfigError(f"backend {spec!r}: directory {u.location} does not exist")
        return Target(spec, "posix", u.location, {}, wrapper)
    if u.scheme == "s3":
        params = dict(u.params)
        params.setdefault("part_size", str(5 << 20))
        return Target(spec, "s3", f"s3://{u.location}/{u.prefix}".rstrip("/"), params, wrapper)
    from chaos.reference.storage.fsspec_store import fsspec_class

    fsspec_class(u)  # an unsupported scheme is refused here, before anything is reached
    return Target(spec, "fsspec", u.location, dict(u.params), wrapper)
