import pytest

from chaos.errors import ConfigError
from chaos.target.protocol import load_checkpointer, validate_spec

MODEL_ONLY = "tests/checkpointers/model_only.py:ModelOnlyCheckpointer"


def test_builtin_names_resolve_without_import():
    for name in ("dcp", "dcp-async", "torch-save"):
        assert validate_spec(name) == name


def test_file_spec_is_made_absolute_and_loads(tmp_path):
    spec = validate_spec(MODEL_ONLY)
    assert spec.startswith("/") and spec.endswith(":ModelOnlyCheckpointer")
    cls = load_checkpointer(spec)
    assert cls.__name__ == "ModelOnlyCheckpointer"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("nonsense", "unknown checkpointer 'nonsense'"),
        ("no/such/file.py:Cls", "checkpointer file not found: no/such/file.py"),
        ("tests/checkpointers/model_only.py:Nope", "defines no class 'Nope'"),
        ("no_such_module_xyz:Cls", "module not found: 'no_such_module_xyz'"),
        ("json:", "malformed checkpointer spec"),
    ],
)
def test_bad_specs_get_clear_errors(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        validate_spec(spec)


def test_class_without_protocol_methods_is_rejected(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("class Half:\n    def save(self, step, state): pass\n")
    with pytest.raises(ConfigError, match="lacks method"):
        load_checkpointer(f"{f}:Half")
