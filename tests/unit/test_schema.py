from execbox.providers.local import LocalProvider
from execbox.providers.schema import parse_size, validate_against_schema

SCHEMA = {
    "endpoint": {"type": "string", "required": True},
    "timeout": {"type": "integer", "default": 30, "min": 1, "max": 60},
    "region": {"type": "string", "options": ["us", "eu"], "default": "us"},
    "flag": {"type": "boolean", "default": False},
    "ratio": {"type": "number", "min": 0, "max": 1},
}


def test_valid_and_defaults():
    clean, errors = validate_against_schema(SCHEMA, {"endpoint": "http://x", "timeout": "10", "flag": "true"})
    assert errors == {}
    assert clean == {"endpoint": "http://x", "timeout": 10, "region": "us", "flag": True}


def test_per_field_errors():
    _, errors = validate_against_schema(SCHEMA, {"timeout": 99, "region": "mars", "flag": "maybe",
                                                 "ratio": "x", "typo": 1})
    assert set(errors) == {"endpoint", "timeout", "region", "flag", "ratio", "typo"}
    assert "required" in errors["endpoint"]
    assert "<= 60" in errors["timeout"]
    assert "one of" in errors["region"]
    assert "unknown field" in errors["typo"]


def test_sizes():
    assert parse_size("512m") == 512 * 1024**2
    assert parse_size("1g") == 1024**3
    assert parse_size("256MiB") == 256 * 1024**2
    for bad in ("lots", "-1m", "0"):
        try:
            parse_size(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_seed_schema_keys_only():
    allowed = {"type", "required", "secret", "label", "description", "placeholder", "default", "options",
               "min", "max", "format"}
    for field, spec in LocalProvider.get_config_schema().items():
        assert set(spec) <= allowed, field
