"""URL and path resolution on a fake file system (pyfakefs): which storage URLs are
accepted, where they point, and that a malformed one creates nothing anywhere.

The whole in-memory tree is compared before and after each attempt, so a URL that was
once read as a relative path (``local:/x`` becoming ``./local:/x``) would show up as a
new directory under the fake working directory.
"""

from __future__ import annotations

import os
import tempfile

import fsspec  # noqa: F401 - imported before the fake file system starts (its protocols load lazily)
import pytest

from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.storage import StorageConfigError, open_storage, parse_url
from chaos.reference.storage.posix import PosixStorage

CWD = "/jobs/run-1"


def _tree() -> set[str]:
    out = set()
    for d, dirs, files in os.walk("/"):
        out |= {os.path.join(d, n) for n in dirs + files}
    return out


@pytest.fixture
def cwd(fs):
    fs.create_dir(CWD)
    os.chdir(CWD)
    return fs


@pytest.mark.parametrize("url, location", [
    ("ckpt", f"{CWD}/ckpt"),
    ("./a:b/c", f"{CWD}/a:b/c"),                 # a colon after ./ is a path
    ("../shared/ckpt", "/jobs/shared/ckpt"),
    ("/abs/with space/and#hash?q", "/abs/with space/and#hash?q"),  # a plain path is taken literally
    ("file:///abs/x%20y", "/abs/x y"),           # a URL is percent-decoded
    ("file:///abs/%23not-a-fragment", "/abs/#not-a-fragment"),
    ("file://localhost/abs/dir", "/abs/dir"),
    ("file:///abs/%E6%95%99%E6%8E%88", "/abs/教授"),
])
def test_paths_and_file_urls_resolve_to_the_directory_they_name(cwd, url, location):
    u = parse_url(url)
    assert (u.scheme, u.location) == ("file", location)
    store = open_storage(url)
    assert isinstance(store, PosixStorage) and store.root == location
    assert not os.path.exists(location), "resolving a URL creates nothing"


MALFORMED = [
    ("", "empty"),
    ("   ", "empty"),
    ("local:/x", "without '//'"),
    ("file:rel/dir", "without '//'"),
    ("s3:bucket/x", "without '//'"),
    ("memory:/x", "without '//'"),
    ("a:b/c", "without '//'"),
    ("://x", "not right after a scheme"),
    ("file://host/x", "absolute path"),
    ("file://rel", "absolute path"),
    ("file:///x#frag", "fragment"),
    ("file:///x#", "fragment"),
    ("file:///x?y=1", "no parameters"),
    ("local://rel/x", "absolute path"),
    ("s3://B/x", "bucket name"),
    ("s3://bucket/x?colour=red", "unknown parameter"),
    ("s3://bucket/x?a=1&&b", "malformed query"),
    ("1x://y", "not right after a scheme"),
]


@pytest.mark.parametrize("url, words", MALFORMED)
def test_a_malformed_url_is_one_typed_line_and_creates_nothing(cwd, url, words):
    before = _tree()
    with pytest.raises(StorageConfigError) as exc:
        ReferenceCheckpointer(url, 0, 1)
    message = str(exc.value)
    assert words in message and repr(url.strip() if url.strip() else url) in message and "\n" not in message
    if url.strip():  # the same URL given as the storage option
        with pytest.raises(StorageConfigError):
            ReferenceCheckpointer(f"{CWD}/ok", 0, 1, storage=url)
    assert _tree() == before, "nothing may be created for a malformed URL"


def test_an_unknown_scheme_fails_at_open_and_leaves_no_scratch_dir(cwd):
    # Well formed, so it gets as far as the private local dir; the failed open removes it.
    before = _tree()
    with pytest.raises(StorageConfigError, match="gopher"):
        ReferenceCheckpointer("gopher://host/dir", 0, 1)
    assert _tree() == before


def test_a_plain_path_creates_exactly_that_directory(cwd):
    before = _tree()
    c = ReferenceCheckpointer("runs/ckpt", 0, 1)
    try:
        assert c.root == f"{CWD}/runs/ckpt"
        assert _tree() - before == {f"{CWD}/runs", f"{CWD}/runs/ckpt"}
    finally:
        c.close()
    assert _tree() - before == {f"{CWD}/runs", f"{CWD}/runs/ckpt"}, "close() keeps a user's directory"


def test_an_object_store_url_keeps_its_scratch_dir_in_the_temp_dir_and_removes_it(cwd):
    before = _tree()
    c = ReferenceCheckpointer("memory://bucket/run", 0, 1)
    try:
        assert os.path.dirname(c.root) == tempfile.gettempdir()
        assert _tree() - before == {c.root}
    finally:
        c.close()
    assert _tree() == before
