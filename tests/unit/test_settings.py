import pytest

from execbox.errors import InvalidConfigError
from execbox.settings import env_duration, env_int, parse_bool, parse_duration, sandbox_timeout, sandbox_type


@pytest.mark.parametrize("raw", ["60", "60s", "1m", " 60 ", "60S", "1M", 60, 60.0, "60000ms"])
def test_sixty_seconds_in_every_form(raw):
    assert parse_duration(raw) == 60.0


@pytest.mark.parametrize("raw,expected", [("1.5", 1.5), ("2h", 7200.0), ("500ms", 0.5)])
def test_other_units(raw, expected):
    assert parse_duration(raw) == expected


@pytest.mark.parametrize("raw", ["", "abc", "60 sec", "-5", "0", "1d", "s60", "6 0", True, "1e3"])
def test_bad_durations_are_sb002_never_a_default(raw):
    with pytest.raises(InvalidConfigError) as ei:
        parse_duration(raw, "SANDBOX_TIMEOUT_SEC")
    assert ei.value.code == "SB002"
    assert ei.value.http_status == 400


def test_timeout_env_parsing():
    assert sandbox_timeout({"SANDBOX_TIMEOUT_SEC": "1m"}) == 60.0
    assert sandbox_timeout({}) == 30.0
    with pytest.raises(InvalidConfigError) as ei:
        sandbox_timeout({"SANDBOX_TIMEOUT_SEC": "sixty"})
    assert "SANDBOX_TIMEOUT_SEC" in ei.value.message


def test_sandbox_type_and_alias():
    assert sandbox_type({"SANDBOX_TYPE": "Jail"}) == "jail"
    assert sandbox_type({"SANDBOX_BACKEND": "docker"}) == "docker"
    assert sandbox_type({"SANDBOX_TYPE": "local", "SANDBOX_BACKEND": "docker"}) == "local"
    assert sandbox_type({"SANDBOX_TYPE": "  "}) is None
    assert sandbox_type({}) is None


def test_parse_bool():
    assert parse_bool("TRUE", "X") is True and parse_bool("off", "X") is False
    with pytest.raises(InvalidConfigError):
        parse_bool("maybe", "X")


def test_env_int_and_duration_default_only_when_unset_or_blank():
    assert env_int("N", 7, env={}) == 7
    assert env_int("N", 7, env={"N": "  "}) == 7
    assert env_int("N", 7, env={"N": " 12 "}) == 12
    assert env_int("N", 7, env={"N": "0"}) == 0
    assert env_duration("D", 5.0, env={}) == 5.0
    assert env_duration("D", 5.0, env={"D": " "}) == 5.0
    assert env_duration("D", 5.0, env={"D": "1m"}) == 60.0


@pytest.mark.parametrize("raw", ["abc", "1.5", "-1", "1k"])
def test_env_int_bad_value_is_sb002_naming_the_variable(raw):
    with pytest.raises(InvalidConfigError) as ei:
        env_int("EXECBOX_X", 7, 0, env={"EXECBOX_X": raw})
    assert ei.value.code == "SB002" and "EXECBOX_X" in ei.value.message


def test_env_int_minimum_and_duration_errors_name_the_variable():
    with pytest.raises(InvalidConfigError, match="EXECBOX_X: must be >= 1"):
        env_int("EXECBOX_X", 7, 1, env={"EXECBOX_X": "0"})
    with pytest.raises(InvalidConfigError, match="EXECBOX_D"):
        env_duration("EXECBOX_D", 5.0, env={"EXECBOX_D": "soon"})
