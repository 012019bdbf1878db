"""Storage URLs and the storage options: bad input is one typed line naming the URL."""

from __future__ import annotations

import pytest

from chaos.checkpoint.options import parse_options
from chaos.ckptformat.errors import CheckpointConfigError
from chaos.storage import StorageConfigError, open_storage, parse_url, wrap_storage
from chaos.storage.posix import PosixStorage


def test_plain_paths_and_file_urls_are_posix(tmp_path):
    assert parse_url(str(tmp_path)).scheme == "file"
    u = parse_url(f"file://{tmp_path}")
    assert (u.scheme, u.location) == ("file", str(tmp_path))
    assert isinstance(open_storage(f"file://{tmp_path}"), PosixStorage)


def test_s3_url_parts():
    u = parse_url("s3://my-bucket/a/b?endpoint_url=http://127.0.0.1:9000&part_size=5242880")
    assert (u.scheme, u.location, u.prefix) == ("s3", "my-bucket", "a/b/")
    assert u.params["endpoint_url"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize("url, words", [
    ("", "empty"),
    ("file://host/x", "absolute path"),
    ("s3://B/x", "bucket name"),
    ("s3://bucket/x?colour=red", "unknown parameter"),
    ("s3://bucket/x?part_size=100&endpoint_url=http://127.0.0.1:1", "part_size"),
    ("gopher://x/y", "fsspec knows no protocol"),
])
def test_bad_urls_are_one_typed_line(url, words):
    with pytest.raises(StorageConfigError) as exc:
        open_storage(url)
    msg = str(exc.value)
    assert words in msg and "\n" not in msg
    assert url in msg or not url


def test_storage_option_is_validated_at_construction():
    assert parse_options(storage="s3://bucket/p?endpoint_url=http://127.0.0.1:1").storage.startswith("s3://")
    with pytest.raises(CheckpointConfigError, match="bucket name"):
        parse_options(storage="s3://X/p")
    with pytest.raises(CheckpointConfigError, match="storage_wrapper"):
        parse_options(storage_wrapper="nocolon")


def test_wrapper_resolution(tmp_path):
    mod = tmp_path / "w.py"
    mod.write_text("class W:\n    def __init__(self, inner):\n        self.inner = inner\n")
    inner = PosixStorage(str(tmp_path))
    assert wrap_storage(inner, f"{mod}:W").inner is inner
    assert wrap_storage(inner, None) is inner
    with pytest.raises(StorageConfigError, match="Missing"):
        wrap_storage(inner, f"{mod}:Missing")


def test_fsspec_urls_keep_their_authority_part():
    """urlunsplit would turn local:///x into local:/x, which then reads as a plain path."""
    assert parse_url("local:///tmp/x/y").location == "local:///tmp/x/y"
    assert parse_url("memory://bucket/p?k=v").location == "memory://bucket/p"
    assert parse_url(parse_url("local:///tmp/x").location + "/sub").scheme == "local"
