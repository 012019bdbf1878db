"""Seeded hostile names, paths and unicode (Faker) against the manifest and storage URLs.

Faker supplies realistic words, file names and paths in many scripts (Japanese, Arabic,
Hebrew, Thai, Greek, Hindi, ...); the tests below splice in what breaks naive code:
``/``, ``%`` escapes, ``#``, ``?``, ``@r0`` (the per-rank entry suffix), ``[0]`` (how an
int key renders), combining marks, bidi overrides, blanks. Hypothesis picks the seed
(``Faker.seed_instance``), so every failure is reproducible from the seed it prints.

What must hold: a state whose keys and strings are such names saves and loads back
exactly, with a valid manifest; a shard name is a plain file name or a typed error naming
the manifest; a storage URL built from such a path resolves to the path it names or is
refused with the typed URL error, and a checkpointer on it creates nothing outside it.
"""

from __future__ import annotations

import functools
import os
import random
import re
import tempfile
import urllib.parse
from pathlib import Path

import pytest
import torch
from faker import Faker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.ckptformat import manifest
from chaos.reference.ckptformat.commit import step_dirname
from chaos.reference.ckptformat.errors import ManifestError
from chaos.reference.storage import StorageConfigError, parse_url

LOCALES = ["en_US", "ja_JP", "zh_CN", "ru_RU", "ar_AA", "he_IL", "el_GR", "hi_IN", "th_TH", "ko_KR", "de_DE", "tr_TR"]
HOSTILE = [" ", "  ", "%", "%20", "%2F", "%25", "%zz", "%E6%95", "#", "?", "&", "=", ";", "@", "@r0", "[0]", "{int:1}",
           "\t", "\u202e", "e\u0301", "\ufeff", "'", '"', "\\", "~", "*", ":", "\u2026", "\U0001f4be", "-", "$HOME"]
# What urllib.parse.urlsplit silently deletes from a URL (WHATWG: ASCII tab and newlines).
URL_STRIPPED = "\t\r\n"
SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@functools.cache
def _faker() -> Faker:
    return Faker(LOCALES)  # built once (about a second); reseeded per example


class Seeded:
    """Faker reseeded for one example, plus a ``random.Random`` on the same seed for the
    splicing (a multi-locale Faker has no ``random`` of its own to lend)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.faker = _faker()
        self.faker.seed_instance(seed)
        self.random = random.Random(seed)

    def __getattr__(self, name: str):
        return getattr(self.faker, name)  # word(), file_name(), sentence(), ...

    def __repr__(self) -> str:
        return f"Seeded({self.seed})"


fakers = st.builds(Seeded, st.integers(0, 2**32 - 1))


def hostile_name(fake: Seeded, joiners: tuple[str, ...] = ("", " ", "_", "/", ".")) -> str:
    """Faker words in assorted scripts with hostile fragments spliced in."""
    r = fake.random
    parts = [fake.word() for _ in range(r.randint(1, 3))]
    for _ in range(r.randint(1, 4)):
        parts.insert(r.randint(0, len(parts)), r.choice(HOSTILE))
    return r.choice(joiners).join(parts)


def hostile_component(fake: Seeded) -> str:
    """One path component (no ``/``, never ``.`` or ``..``, no NUL, no blank at either end:
    the tests at the end check that those are refused)."""
    name = hostile_name(fake, joiners=("", " ", "_", "-", ".")).strip()
    return name if name.strip(".") else name + "x"


# -- a state named by Faker round-trips ---------------------------------------------

def _state(fake: Seeded) -> tuple[dict, dict]:
    r = fake.random
    keys = list(dict.fromkeys(hostile_name(fake) for _ in range(r.randint(2, 7))))
    model = {k: torch.randn(r.randint(1, 4), r.randint(1, 3), generator=torch.Generator().manual_seed(r.getrandbits(31)))
             for k in keys}
    notes = {hostile_name(fake): fake.sentence() for _ in range(3)}
    state = {"model": model, "optimizer": {"state": {}, "param_groups": []}, "notes": notes,
             "corpus": fake.paragraph().encode("utf-8")}
    template = {"model": {k: torch.zeros_like(v) for k, v in model.items()}, "optimizer": {"state": {}, "param_groups": []},
                "notes": dict.fromkeys(notes, ""), "corpus": b""}
    return state, template


@pytest.mark.parametrize("serializer", ["native", "safetensors"])
@FUZZ
@given(fake=fakers)
def test_a_state_named_in_hostile_unicode_round_trips(tmp_path, serializer, fake):
    state, template = _state(fake)
    root = tempfile.mkdtemp(dir=tmp_path)
    c = ReferenceCheckpointer(root, 0, 1, serializer=serializer)
    try:
        c.save(3, state)
        step, got = c.load_latest(template)
    finally:
        c.close()
    assert step == 3
    assert list(got["model"]) == list(state["model"]), "every key, in order, exactly as saved"
    for k, t in state["model"].items():
        assert torch.equal(got["model"][k], t), k
    assert got["notes"] == state["notes"] and got["corpus"] == state["corpus"]
    # The manifest on disk is valid and names one entry per tensor (no two keys collided).
    m = manifest.read_manifest(os.path.join(root, step_dirname(3)), expect_step=3)
    assert len(m["entries"]) == len(state["model"])
    again = manifest.validate(manifest.safe_json_loads(manifest.encode_manifest(m), "again"), "again", 3)
    assert again == m


# -- shard names ------------------------------------------------------------------------

MANIFEST_FILE = "/ckpt/step-0000000001/manifest.json"


@FUZZ
@given(fake=fakers)
def test_a_shard_name_is_a_plain_file_name_or_a_typed_error(fake):
    r = fake.random
    names = [fake.file_name(), fake.file_path(depth=r.randint(1, 3)), hostile_name(fake), "../" + fake.file_name(),
             fake.file_name() + "/" + hostile_component(fake), "C:" + fake.file_name(), "\\\\" + fake.file_name(),
             r.choice([".", "..", "", manifest.MANIFEST_NAME])]
    for name in names:
        try:
            got = manifest.check_name(name, MANIFEST_FILE, "shard")
        except ManifestError as exc:
            assert exc.file == MANIFEST_FILE and str(exc).startswith(MANIFEST_FILE + ": shard ")
            continue
        assert got == name and name not in (".", "..") and os.path.basename(name) == name
        assert os.path.dirname(os.path.normpath(os.path.join("/d", name))) == "/d", "stays inside the checkpoint directory"


# -- storage URLs from Faker paths ----------------------------------------------------

def _components(fake: Seeded) -> list[str]:
    return [hostile_component(fake) for _ in range(fake.random.randint(1, 3))]


@FUZZ
@given(fake=fakers)
def test_a_faker_path_resolves_to_itself_or_is_refused(fake):
    parts = _components(fake)
    if fake.random.random() < 0.3:
        parts.insert(fake.random.randint(0, len(parts)), fake.random.choice([".", ".."]))
    path = "/base/" + "/".join(parts)
    # A plain absolute path is taken literally (normalised); no character in it is special.
    assert (parse_url(path).scheme, parse_url(path).location) == ("file", os.path.normpath(path))
    # Properly encoded, as pathlib writes it, the file URL names the same path.
    uri = Path(path).as_uri()
    assert parse_url(uri).location == str(Path(path))
    # Written naively, '#' and '?' are URL syntax: refused, never silently cut off.
    naive = "file://" + path
    if "#" in path or "?" in path:
        with pytest.raises(StorageConfigError, match="fragment|no parameters|malformed query|control character"):
            parse_url(naive)
    elif set(URL_STRIPPED) & set(path):  # urlsplit would delete them: refused instead
        with pytest.raises(StorageConfigError, match="control character"):
            parse_url(naive)
    else:
        assert parse_url(naive).location == urllib.parse.unquote(path)
    # A relative path resolves under the working directory, unless it starts like a scheme.
    rel = "/".join(parts)
    if SCHEME_LIKE.match(rel):
        with pytest.raises(StorageConfigError, match="without '//'"):
            parse_url(rel)
    else:
        assert parse_url(rel).location == os.path.abspath(rel)


def _tree(top: Path) -> set[str]:
    out = set()
    for d, dirs, files in os.walk(top):
        out |= {os.path.join(d, n) for n in dirs + files}
    return out


def _ancestors_and_inside(root: str, base: Path) -> set[str]:
    ok = set()
    p = Path(root)
    while p != base and base in p.parents:
        ok.add(str(p))
        p = p.parent
    return ok


@FUZZ
@given(fake=fakers)
def test_a_checkpointer_on_a_faker_url_writes_only_where_it_names(tmp_path, monkeypatch, fake):
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    cwd = scratch / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    parts = _components(fake)
    target = str(scratch / "base" / Path(*parts))
    rel = "/".join(parts)
    urls = {"plain": target, "as_uri": Path(target).as_uri(), "naive": "file://" + target, "relative": rel}
    state = {"model": {hostile_name(fake): torch.arange(4.0)}, "optimizer": {"state": {}, "param_groups": []}}
    for how, url in urls.items():
        before = _tree(scratch)
        try:
            c = ReferenceCheckpointer(url, 0, 1)
        except StorageConfigError as exc:
            assert how in ("naive", "relative"), f"{how} {url!r} refused: {exc}"
            assert repr(url) in str(exc), "the error names the URL"
            assert _tree(scratch) == before, f"{how} {url!r}: refused, yet something was created"
            continue
        try:
            expected = os.path.abspath(parse_url(url).location)
            assert c.root == expected
            if how in ("plain", "as_uri"):
                assert expected == target
            if how == "relative":
                assert Path(expected).is_relative_to(cwd)
            c.save(1, state)
            step, got = c.load_latest({"model": {k: torch.zeros(4) for k in state["model"]},
                                       "optimizer": {"state": {}, "param_groups": []}})
            assert step == 1 and torch.equal(next(iter(got["model"].values())), torch.arange(4.0))
        finally:
            c.close()
        new = _tree(scratch) - before
        allowed = _ancestors_and_inside(c.root, scratch)
        stray = sorted(p for p in new if p not in allowed and not Path(p).is_relative_to(c.root))
        assert not stray, f"{how} {url!r} wrote outside {c.root}: {stray}"


@pytest.mark.parametrize("url", ["/tmp/never\x00made", "file:///tmp/never%00made"])
def test_a_nul_byte_in_a_path_is_the_typed_url_error(tmp_path, url):
    with pytest.raises(StorageConfigError):
        ReferenceCheckpointer(url.replace("/tmp", str(tmp_path)), 0, 1)


def test_a_path_ending_in_a_blank_names_that_path_or_is_refused(tmp_path):
    target = str(tmp_path / "run ")
    try:
        location = parse_url(target).location
    except StorageConfigError:
        return
    assert location == target


@pytest.mark.parametrize("char", list(URL_STRIPPED))
def test_a_raw_tab_or_newline_in_a_url_names_that_path_or_is_refused(tmp_path, char):
    target = f"{tmp_path}/a{char}b"
    try:
        location = parse_url("file://" + target).location
    except StorageConfigError:
        return
    assert location == target
