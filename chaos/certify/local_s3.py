"""``s3-local``: an embedded S3 endpoint (moto's ThreadedMotoServer) on 127.0.0.1.

Why: certification and the s3 suites must run on a fresh machine with nothing
installed by hand. moto is a real HTTP S3 endpoint (it honours ``If-None-Match: *``
and ``If-Match`` on PUT and DELETE, measured) that lives in this process, on a free
port, started and stopped by the harness. Rank processes reach it over TCP like any
other endpoint, so a fault proxy can sit in between.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from chaos.launch.ports import free_port


class LocalS3:
    """Context manager: ``with LocalS3() as s3: url = s3.url("prefix")``."""

    def __init__(self, bucket: str = "chaos-ckpt") -> None:
        self.bucket = bucket
        self.server: Any = None
        self.endpoint = ""

    def start(self) -> LocalS3:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def client(self, endpoint: str | None = None) -> Any:
        from chaos.reference.storage.base import parse_url
        from chaos.reference.storage.s3 import make_client

        return make_client(parse_url(f"s3://{self.bucket}/?endpoint_url={endpoint or self.endpoint}"))

    def url(self, prefix: str | None = None, endpoint: str | None = None, **params: Any) -> str:
        """An ``s3://`` URL under a fresh (or given) prefix, pointing at this server or ``endpoint``."""
        prefix = prefix or f"run-{uuid.uuid4().hex[:10]}"
        query = "&".join([f"endpoint_url={endpoint or self.endpoint}"] + [f"{k}={v}" for k, v in params.items()])
        return f"s3://{self.bucket}/{prefix}?{query}"

    def stop(self) -> None:
        if self.server is not None:
            try:
                self.server.stop()
            finally:
                self.server = None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
