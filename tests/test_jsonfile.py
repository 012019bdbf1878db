"""write_json_atomic: a reader sees the old document or the new one, never half, never a stray temp file."""

import json

import pytest

from reports.jsonfile import write_json_atomic


def test_a_document_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "deep" / "results.json"
    write_json_atomic(target, {"n": 1})
    write_json_atomic(target, {"n": 2}, indent=1)
    assert json.loads(target.read_text()) == {"n": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == ["results.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "results.json"
    write_json_atomic(target, {"n": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"n": object()})
    assert json.loads(target.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    write_json_atomic(target, {"n": object()}, default=lambda o: "obj")
    assert json.loads(target.read_text()) == {"n": "obj"}
