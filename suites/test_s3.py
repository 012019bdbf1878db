"""The reference checkpointer on the embedded S3 endpoint (moto), with faults between ranks and store.

A rank killed while uploading its shard, and the object store's connections reset
mid-upload through the user-space fault proxy: the restarted job resumes bit-exactly
and no partial checkpoint is ever loaded.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.s3]

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3():
    from chaos.certify.local_s3 import LocalS3

    with LocalS3() as server:
        yield server


def test_kill_mid_upload_resumes_bit_exact(chaos, s3):
    sc = chaos.scenario("reference", ["kill:rank=1,phase=write_shards,step=15"], steps=20,
                        ckpt_options={"storage": s3.url()})
    sc.backend = "s3"
    chaos.check(chaos.run(sc))


def test_store_connection_resets_mid_upload(chaos, s3):
    """Every connection to the store is reset after 300 kB until 4 resets have happened, then the link heals.

    Healing is counted in resets, not seconds, so a slow machine sees the same fault.
    """
    import threading
    import time

    from faults.tcpproxy import FaultProxy, ProxyRule

    host, port = s3.endpoint.split("//")[1].split(":")
    with FaultProxy((host, int(port)), seed=0) as proxy:
        proxy.set_rules([ProxyRule("reset", after_bytes=300_000, once=False)])
        done = threading.Event()

        def heal() -> None:
            while not done.is_set():
                if sum(e["action"] == "reset" for e in list(proxy.log)) >= 4:
                    proxy.set_rules([])
                    return
                time.sleep(0.05)

        healer = threading.Thread(target=heal, daemon=True)
        healer.start()
        try:
            sc = chaos.scenario("reference", [], steps=20, ckpt_options={"storage": s3.url(endpoint=proxy.endpoint, retries=1)})
            sc.backend = "s3"
            result = chaos.run(sc)
        finally:
            done.set()
            healer.join(5)
        chaos.check(result)
        assert any(e["action"] == "reset" for e in proxy.log), "the proxy never reset a connection: the fault did not bite"
