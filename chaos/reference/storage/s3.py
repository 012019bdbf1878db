"""S3 backend (boto3): shards under a step prefix, a conditional commit object, a CAS ``latest``.

Why this protocol: S3 has no rename, so "write to a temp name then rename" would be a
copy-then-delete that a crash can interrupt halfway. Instead every object of a save is
written under its own data prefix (``data/step-N-<nonce>/``) where no loader looks, and
the *commit point* is one small object ``commits/step-N.json`` created with
``If-None-Match: *``: it either exists completely or not at all, and of two writers
racing for the same step exactly one wins (the other gets 412 and its save fails). A
job that re-saves a step whose commit it saw before (a checkpoint its loader rejected,
or one newer than ``latest`` from an abandoned timeline) supersedes it by a
conditional delete (``If-Match`` on the ETag it saw) followed by the same conditional
create; a commit it never saw is somebody else's, and the save fails. Loaders only follow commit objects, so partial shards, uncompleted multipart
uploads and manifests of failed saves are invisible. ``latest`` is a hint updated by
compare-and-swap (``If-Match`` on the ETag read, ``If-None-Match: *`` when absent).

Integrity: large shards go up as multipart uploads; each part carries its SHA-256
(``ChecksumSHA256``: stores that verify it reject a damaged part) and the part ETag the
store returns is compared with the MD5 we computed (moto, the embedded server, does
*not* verify ``ChecksumSHA256`` — measured — but its ETag is the MD5 of what it
received, so the comparison is a real end-to-end check there). After completion the
object's size is read back before the shard is reported durable.

Layout under ``s3://bucket/prefix/``::

    data/step-0000000010-<nonce>/shard-r00000.safetensors, ..., manifest.json
    commits/step-0000000010.json            {"step", "data", "manifest_sha256", ...}
    latest                                  "step-0000000010\\n"
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from chaos.phases import phase
from chaos.reference.ckptformat import commit, manifest
from chaos.reference.ckptformat.errors import CorruptCheckpointError
from chaos.reference.storage.base import (
    CommitConflict,
    StorageConfigError,
    StorageError,
    StorageURL,
)
from chaos.reference.storage.objects import MAX_COMMIT, MAX_LATEST, CommitObjectStore

MIN_PART = 5 * 1024 * 1024
COMMIT_KEY = re.compile(r"^commits/step-(\d{1,19})\.json\Z")


def _b64sha256(data: Any) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def _code(exc: BaseException) -> str:
    resp = getattr(exc, "response", None) or {}
    return str(resp.get("Error", {}).get("Code", ""))


def make_client(u: StorageURL) -> Any:
    """A boto3 S3 client for the URL; dummy credentials only for an explicit local endpoint."""
    import boto3
    from botocore.config import Config

    p = u.params
    try:
        cfg = Config(
            connect_timeout=float(p.get("connect_timeout", 5)),
            read_timeout=float(p.get("read_timeout", 30)),
            retries={"max_attempts": int(p.get("retries", 2)), "mode": "standard"},
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
    except ValueError as exc:
        raise StorageConfigError(f"storage URL {u.raw!r}: bad timeout/retries parameter: {exc}") from None
    kwargs: dict[str, Any] = {"config": cfg, "region_name": p.get("region", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))}
    endpoint = p.get("endpoint_url")
    if endpoint:
        kwargs["endpoint_url"] = endpoint
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(aws_access_key_id="chaos", aws_secret_access_key="chaos")
    return boto3.session.Session().client("s3", **kwargs)


class S3ShardWriter:
    """File-like writer that streams a shard into one object (multipart above the part size).

    Nothing becomes visible under the key until :meth:`finish` completes the upload, and
    even then no loader reads it before the commit object names its data prefix.
    """

    def __init__(self, store: S3Storage, key: str) -> None:
        self.store, self.key = store, key
        self.buf = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.size = 0
        self.done = False

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        self.buf += mv
        self.size += len(mv)
        while len(self.buf) >= self.store.part_size:
            self._upload_part(bytes(self.buf[: self.store.part_size]))
            del self.buf[: self.store.part_size]
        return len(mv)

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.size

    def _upload_part(self, body: bytes) -> None:
        c, bucket = self.store.client, self.store.bucket
        if self.upload_id is None:
            self.upload_id = c.create_multipart_upload(Bucket=bucket, Key=self.key, ChecksumAlgorithm="SHA256")["UploadId"]
        number = len(self.parts) + 1
        checksum = _b64sha256(body)
        r = c.upload_part(Bucket=bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body,
                          ChecksumSHA256=checksum)
        etag = r["ETag"]
        if etag.strip('"') != hashlib.md5(body).hexdigest():
            raise StorageError(f"{self.store.url_of(self.key)}: part {number} ETag {etag} is not the MD5 of the bytes sent (damaged in transit)")
        self.parts.append({"PartNumber": number, "ETag": etag, "ChecksumSHA256": r.get("ChecksumSHA256", checksum)})

    def finish(self) -> None:
        """Complete the upload and read back its size: after this the shard is durable."""
        c, bucket = self.store.client, self.store.bucket
        if self.upload_id is None:
            body = bytes(self.buf)
            r = c.put_object(Bucket=bucket, Key=self.key, Body=body, ChecksumSHA256=_b64sha256(body))
            if r["ETag"].strip('"') != hashlib.md5(body).hexdigest():
                raise StorageError(f"{self.store.url_of(self.key)}: ETag {r['ETag']} is not the MD5 of the bytes sent")
        else:
            if self.buf:
                self._upload_part(bytes(self.buf))
            c.complete_multipart_upload(Bucket=bucket, Key=self.key, UploadId=self.upload_id,
                                        MultipartUpload={"Parts": self.parts})
        self.buf = bytearray()
        head = c.head_object(Bucket=bucket, Key=self.key)
        if head["ContentLength"] != self.size:
            raise StorageError(f"{self.store.url_of(self.key)}: stored {head['ContentLength']} bytes, wrote {self.size}")
        self.done = True

    def abort(self) -> None:
        if self.upload_id is not None and not self.done:
            try:
                self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id)
            except Exception:  # noqa: BLE001 - orphans are aborted by clean_stale later
                pass

    def close(self) -> None:
        if not self.done:
            self.abort()

    def __enter__(self) -> S3ShardWriter:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None or not self.done:
            self.abort()


class S3Storage(CommitObjectStore):
    """``s3://bucket/prefix?endpoint_url=...``: see the module docstring for the protocol."""

    kind = "s3"
    exclusive_commit = True  # does the commit point refuse a second writer?
    commit_protocol = (
        "shards and manifest under data/step-N-<nonce>/ (multipart with per-part SHA-256, ETag=MD5 checked, size read back); "
        "commit point: commits/step-N.json created with If-None-Match: * (exactly one writer wins; a re-save "
        "supersedes only a commit this job saw, by delete If-Match); "
        "latest updated by compare-and-swap (If-Match ETag); orphaned data and multipart uploads removed by clean_stale"
    )

    shard_missing = "shard object is missing"
    manifest_missing = "manifest object is missing"

    def __init__(self, u: StorageURL, local_dir: str | None = None, client: Any = None) -> None:
        """``local_dir``: parent of shard download temp dirs (None: tempfile.gettempdir())."""
        super().__init__(local_dir)
        self.u = u
        self.url = u.raw
        self.bucket, self.prefix = u.location, u.prefix
        try:
            self.part_size = int(u.params.get("part_size", 8 * 1024 * 1024))
        except ValueError:
            raise StorageConfigError(f"storage URL {u.raw!r}: part_size must be an integer") from None
        if self.part_size < MIN_PART:
            raise StorageConfigError(f"storage URL {u.raw!r}: part_size must be >= {MIN_PART} (S3's minimum part size)")
        self.client = client or make_client(u)
        self.latest_key = self.prefix + commit.LATEST
        self._seen: dict[int, str] = {}  # step -> ETag of commit objects this instance listed
        if u.params.get("create_bucket", "").lower() in ("1", "true", "yes"):
            self.ensure_bucket()

    # -- helpers ------------------------------------------------------------------
    def url_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def ensure_bucket(self) -> None:
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _list(self, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            r = self.client.list_objects_v2(**kw)
            out.extend(r.get("Contents", []))
            if not r.get("IsTruncated"):
                return out
            token = r["NextContinuationToken"]

    def _read(self, key: str, limit: int) -> bytes | None:
        got = self._get(key, limit)
        return None if got is None else got[0]

    def _size(self, key: str) -> tuple[int | None, Any] | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        return int(head["ContentLength"]), head["ETag"]

    @contextlib.contextmanager
    def _open_range(self, key: str, size: int, version: Any) -> Iterator[Any]:
        """A ranged GET of bytes ``[0, size)``, only of the object whose HEAD gave ``version`` (its ETag)."""
        if size <= 0:
            yield io.BytesIO(b"")
            return
        kw: dict[str, Any] = {"IfMatch": version} if version else {}
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{size - 1}", **kw)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            if _code(exc) in ("PreconditionFailed", "412"):
                raise CorruptCheckpointError(self.url_of(key), "the object was replaced between its size check and "
                                                               "its download") from None
            raise
        body = r["Body"]
        try:
            yield body
        finally:
            body.close()

    def _get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """At most ``limit + 1`` first bytes of the object (a ranged GET, read no further) and its ETag."""
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{limit}")
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            if _code(exc) != "InvalidRange":
                raise
            # An empty object has no byte 0 to range over: it is b"", and a HEAD gives its ETag.
            found = self._size(key)
            return None if found is None else (b"", found[1])
        body = r["Body"]
        try:
            return body.read(limit + 1), r["ETag"]
        finally:
            body.close()

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            if chunk:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})

    def _data_for_tmp(self, step: int, nonce: str) -> str:
        return f"{self.prefix}data/step-{step:010d}-{nonce}/"

    def _data_location(self, relative: str) -> str:
        return self.prefix + relative

    def _commits(self) -> dict[int, str]:
        """Committed steps -> commit key; remembers each ETag (see ``publish``)."""
        out: dict[int, str] = {}
        for o in self._list(self.prefix + "commits/"):
            m = COMMIT_KEY.match(o["Key"][len(self.prefix):])
            if m:
                out[int(m.group(1))] = o["Key"]
                self._seen[int(m.group(1))] = o["ETag"]
        return out

    # -- save ---------------------------------------------------------------------
    def create_shard(self, tmp_name: str, name: str) -> S3ShardWriter:
        return S3ShardWriter(self, self._tmp_data(tmp_name) + name)

    def durable(self, f: Any) -> None:
        f.finish()

    def commit_key(self, step: int) -> str:
        return f"{self.prefix}commits/step-{step:010d}.json"

    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        """Rank 0 after the vote: manifest, then the conditional commit object, then ``latest``."""
        data = self._tmp_data(tmp_name)
        phase("write_manifest", step=step)
        self.client.put_object(Bucket=self.bucket, Key=data + manifest.MANIFEST_NAME, Body=manifest_bytes,
                               ChecksumSHA256=_b64sha256(manifest_bytes))
        phase("commit", step=step)
        key = self.commit_key(step)
        seen = self._seen.get(step)
        if seen is not None:  # a re-save of a step this job saw committed: supersede exactly that one
            try:
                self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=seen)
            except Exception as exc:  # noqa: BLE001
                if _code(exc) not in ("NoSuchKey", "404"):
                    raise CommitConflict(f"{self.url_of(key)}: step {step} was committed again by another writer") from exc
        body = json.dumps({"format": "chaos-commit", "step": step, "data": data[len(self.prefix):],
                           "manifest_size": len(manifest_bytes),
                           "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest()}).encode()
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise CommitConflict(f"{self.url_of(key)}: another writer committed step {step} first") from exc
            raise
        self._published = (step, key, r["ETag"])
        self._seen[step] = r["ETag"]
        phase("update_latest", step=step)
        self.set_latest(step)

    def set_latest(self, step: int, attempts: int = 5) -> None:
        """Compare-and-swap the ``latest`` pointer; a lost race is retried on the fresh ETag."""
        key = self.latest_key
        body = (commit.step_dirname(step) + "\n").encode()
        for _ in range(attempts):
            cur = self._get(key, MAX_LATEST)
            cond = {"IfMatch": cur[1]} if cur is not None else {"IfNoneMatch": "*"}
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, **cond)
                return
            except Exception as exc:  # noqa: BLE001
                if _code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    raise
        raise StorageError(f"{self.url_of(key)}: latest pointer kept changing under us ({attempts} attempts)")

    def _unpublish(self, published: Any) -> None:
        _, key, etag = published
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=etag)
        except Exception:  # noqa: BLE001 - not ours any more, or already gone
            pass

    def _delete_commit(self, step: int, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)
        self._seen.pop(step, None)

    def _remove_data(self, data: str) -> None:
        self._abort_uploads(data)
        self._delete_keys([o["Key"] for o in self._list(data)])

    def _abort_uploads(self, prefix: str) -> list[str]:
        aborted = []
        r = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        for up in r.get("Uploads", []) or []:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
                aborted.append(f"multipart:{up['Key']}")
            except Exception:  # noqa: BLE001
                pass
        return aborted

    def clean_stale(self) -> list[str]:
        """Data of saves no commit names, and every uncompleted multipart upload under the prefix.

        Like the POSIX version, only safe when no save of this job is in flight (rank 0
        at start-up and after a failed vote).
        """
        removed = self._abort_uploads(self.prefix + "data/")
        for d, keys in self._unreferenced().items():
            self._delete_keys(keys)
            removed.append(d)
        return removed

    def _unreferenced(self) -> dict[str, list[str]]:
        """Data prefixes no commit object names -> their keys."""
        referenced = {self._data_named_by(self._read(key, MAX_COMMIT)) for key in self._commits().values()}
        doomed: dict[str, list[str]] = {}
        for o in self._list(self.prefix + "data/"):
            rest = o["Key"][len(self.prefix) + len("data/"):]
            d = self.prefix + "data/" + rest.split("/", 1)[0] + "/"
            if d not in referenced:
                doomed.setdefault(d, []).append(o["Key"])
        return doomed

    def unreferenced_data(self) -> list[str]:
        """Data prefixes no commit names: orphans of crashed or failed saves."""
        return sorted(self._unreferenced())

    def uncompleted_uploads(self) -> list[str]:
        """Keys of multipart uploads under the prefix that were never completed."""
        r = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        return sorted(u["Key"] for u in r.get("Uploads", []) or [])

    # -- load ---------------------------------------------------------------------
    def list_steps(self) -> list[int]:
        return sorted(self._commits(), reverse=True)
