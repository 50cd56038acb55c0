"""EXECBOX_AUDIT_DAYS / EXECBOX_EGRESS_AUDIT_DAYS are parsed like every other setting: a number of
days >= 0 (0 keeps everything), anything else SB002 naming the variable at start
(ServiceSettings.from_env); a writer embedded without that check keeps the default, never "all"."""

import logging

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.config import ServiceSettings
from execbox.service.store.retention import retention_days


@pytest.mark.parametrize("raw, days", [("0", 0.0), ("30", 30.0), (" 1.5 ", 1.5)])
def test_good_values_are_read(raw: str, days: float) -> None:
    s = ServiceSettings.from_env({"EXECBOX_AUDIT_DAYS": raw, "EXECBOX_EGRESS_AUDIT_DAYS": raw})
    assert (s.audit_days, s.egress_audit_days) == (days, days)


@pytest.mark.parametrize("var", ["EXECBOX_AUDIT_DAYS", "EXECBOX_EGRESS_AUDIT_DAYS"])
@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "inf", "30d"])
def test_bad_values_are_sb002_naming_the_variable(var: str, raw: str) -> None:
    with pytest.raises(InvalidConfigError) as e:
        ServiceSettings.from_env({var: raw})
    assert e.value.details["field"] == var and var in e.value.message


def test_an_unchecked_bad_value_keeps_the_default_and_warns(monkeypatch, caplog) -> None:
    monkeypatch.setenv("EXECBOX_AUDIT_DAYS", "-1")  # before: clamped to 0, i.e. "keep every row"
    with caplog.at_level(logging.WARNING):
        assert retention_days("EXECBOX_AUDIT_DAYS", 365.0) == 365.0
    assert "EXECBOX_AUDIT_DAYS" in caplog.text
    monkeypatch.setenv("EXECBOX_AUDIT_DAYS", "7")
    assert retention_days("EXECBOX_AUDIT_DAYS", 365.0) == 7.0
