"""Storage URLs and the storage options: bad input is one typed line naming the URL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.checkpoint.options import parse_options
from chaos.reference.ckptformat.errors import CheckpointConfigError
from chaos.reference.storage import StorageConfigError, open_storage, parse_url, wrap_storage
from chaos.reference.storage.posix import PosixStorage


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


@pytest.mark.parametrize("url", ["ftp://x/ckpt", "http://x/ckpt", "zip://x/ckpt", "github://x/ckpt"])
def test_a_scheme_that_is_no_checkpoint_store_is_refused_before_any_host_is_looked_up(url, monkeypatch):
    """``--backend ftp://x`` once looked host x up (and ended in a harness error)."""
    import socket

    from chaos.certify.target import resolve

    def no_lookup(*args, **kw):
        raise AssertionError(f"looked up {args[:2]} before refusing")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    monkeypatch.setattr(socket, "gethostbyname", no_lookup)
    for attempt in (open_storage, resolve):
        with pytest.raises(StorageConfigError, match="not a checkpoint store") as exc:
            attempt(url)
        assert url in str(exc.value) and "\n" not in str(exc.value)


def test_certify_refuses_an_ftp_backend_in_one_line_with_exit_2():
    out = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", "ftp://x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a checkpoint store: 'ftp'" in out.stderr and "harness error" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


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


MALFORMED = [
    ("local:/x", "'local:' without '//'"),
    ("file:relative", "'file:' without '//'"),
    ("file:/abs", "'file:' without '//'"),
    ("s3:b/x", "'s3:' without '//'"),
    ("memory:/x", "'memory:' without '//'"),
    ("a:b/c", "'a:' without '//'"),
    ("local://tmp/x", "needs an absolute path"),
    ("local:tmp/x", "'local:' without '//'"),
    ("file:///tmp/x?mode=fast", "take no parameters"),
    ("file:///tmp/x#frag", "fragment"),
    ("s3://bucket/x#frag", "fragment"),
    ("./x://y", "not right after a scheme"),
]


@pytest.mark.parametrize("url, words", MALFORMED)
def test_malformed_urls_are_refused_and_create_nothing(url, words, tmp_path, monkeypatch):
    """Hole 1: no scheme-like string without // silently becomes a directory under the cwd."""
    monkeypatch.chdir(tmp_path)
    for attempt in (lambda: parse_url(url), lambda: open_storage(url), lambda: parse_options(storage=url),
                    lambda: ReferenceCheckpointer(url, 0, 1, metrics=False)):
        with pytest.raises(StorageConfigError) as exc:
            attempt()
        msg = str(exc.value)
        assert words in msg and url in msg and "accepted:" in msg and "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_a_relative_path_with_a_colon_is_written_with_a_dot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_url("./a:b/c").location == str(tmp_path / "a:b" / "c")
    assert parse_url("rel/dir").location == str(tmp_path / "rel" / "dir")
    assert parse_url("file://localhost/tmp/x").location == "/tmp/x"


def _cli(args: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, object]:
    """Run the CLI in an empty cwd with its own HOME and TMPDIR (golden cache, fork server)."""
    cwd, home, tmp = (tmp_path / n for n in ("cwd", "home", "tmp"))
    for d in (cwd, home, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "CHAOS_CACHE_DIR")}
    env |= {"OMP_NUM_THREADS": "1", "HOME": str(home), "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)
    return r, cwd


@pytest.mark.parametrize("args", [
    ["certify", "--backend", "local:/x"],
    ["certify", "--backend", "local://tmp/x"],
    ["run", "--ckpt-opt", "storage=local:/x", "--fault", "kill:rank=1,step=5", "--steps", "6"],
], ids=["certify-local:/", "certify-local://rel", "run-storage=local:/"])
def test_cli_refuses_a_malformed_url_with_one_line_and_an_empty_cwd(args, tmp_path):
    r, cwd = _cli(args, tmp_path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "accepted:" in r.stderr and "local:" in r.stderr
    assert list(cwd.iterdir()) == [], "nothing may be created in the current directory"
