import pytest

from execbox import get_sandbox
from execbox.errors import InvalidConfigError
from execbox.models import TIER_ORDER, Isolation
from execbox.providers import registry
from execbox.providers.base import SandboxProvider


def test_builtins_are_entry_points():
    names = registry.provider_names()
    assert {"local", "jail", "docker", "self_managed", "e2b", "aliyun_codeinterpreter"} <= set(names)
    assert issubclass(registry.get_provider_class("local"), SandboxProvider)


def test_unknown_provider_is_sb002():
    with pytest.raises(InvalidConfigError) as ei:
        registry.get_provider_class("nope")
    assert "local" in ei.value.details["known"]


def test_zero_config_picks_strongest_usable(monkeypatch):
    choice, skipped = registry.strongest_available()
    cls = registry.get_provider_class(choice)
    assert cls.zero_config and cls.availability()[0]
    rank = TIER_ORDER.index(Isolation(cls.isolation))
    for name, c in registry.provider_classes().items():
        if c.zero_config and TIER_ORDER.index(Isolation(c.isolation)) < rank:
            assert name in skipped and not c.availability()[0]


def test_get_sandbox_env(monkeypatch):
    p = get_sandbox(env={"SANDBOX_BACKEND": "local", "SANDBOX_TIMEOUT_SEC": "1m"})
    try:
        assert p.name == "local" and p.config["timeout"] == 60
    finally:
        p.shutdown()
    with pytest.raises(InvalidConfigError):
        get_sandbox(env={"SANDBOX_TYPE": "local", "SANDBOX_TIMEOUT_SEC": "60 seconds"})
    with pytest.raises(InvalidConfigError):
        get_sandbox(env={"SANDBOX_TYPE": "warp-drive"})


def test_zero_config_never_falls_back_to_no_isolation(monkeypatch):
    """With every isolating provider unusable (bwrap missing, every box uid in use...), a caller
    who asked for nothing gets SB009 naming why and how to choose local on purpose, not a run on
    the host as the service's user."""
    from execbox.errors import ProviderUnavailableError

    assert not registry.get_provider_class("local").zero_config
    for c in registry.provider_classes().values():
        if c.zero_config:
            monkeypatch.setattr(c, "availability", classmethod(lambda cls: (False, "disabled for this test")))
    with pytest.raises(ProviderUnavailableError) as ei:
        get_sandbox(env={})
    assert "disabled for this test" in ei.value.message and "SANDBOX_TYPE=local" in ei.value.message
    p = get_sandbox(env={"SANDBOX_TYPE": "local"})  # explicitly: still there for development
    try:
        assert p.name == "local"
    finally:
        p.shutdown()


def test_nothing_usable_names_each_providers_reason(monkeypatch):
    """SB009 says why in its message, not only in details: a CLI or log line is all many see."""
    from execbox.errors import ProviderUnavailableError

    for c in registry.provider_classes().values():
        if c.zero_config:
            monkeypatch.setattr(c, "availability", classmethod(lambda cls: (False, f"{cls.name} is off here")))
    with pytest.raises(ProviderUnavailableError) as ei:
        registry.strongest_available(["jail", "local"])
    assert ei.value.code == "SB009"
    assert "jail: jail is off here" in ei.value.message
    assert ei.value.details["reasons"] == {"jail": "jail is off here"}  # local is never a candidate


def test_nothing_registered_says_the_package_metadata_is_missing(monkeypatch):
    """Run from src/ without an install there are no entry points: say so, not 'the host'."""
    from execbox.errors import ProviderUnavailableError

    monkeypatch.setattr(registry, "provider_classes", lambda: {})
    with pytest.raises(ProviderUnavailableError) as ei:
        registry.strongest_available()
    assert "entry-point group 'execbox.providers'" in ei.value.message and "pip install" in ei.value.message


def test_a_failed_jail_probe_is_looked_at_again(monkeypatch):
    """Some probe failures pass (every box uid in use, a trial box slow under load): one bad
    moment at start must not rule the jail out for the life of the process."""
    from execbox.providers import jail

    answers = iter([(False, "host_uid: all 1 box uids are in use"), (True, "ok")])
    monkeypatch.setattr(jail.JailProvider, "_probe", classmethod(lambda cls: next(answers)))
    monkeypatch.setattr(jail, "_avail", None)
    monkeypatch.setattr(jail, "_avail_at", 0.0)  # restored after the test, as _avail is
    assert jail.JailProvider.availability() == (False, "host_uid: all 1 box uids are in use")
    assert jail.JailProvider.availability()[0] is False  # within the re-check time: cached
    # the failure was found longer ago than the re-check time
    monkeypatch.setattr(jail, "_avail_at", jail._avail_at - jail.AVAIL_RECHECK - 1)
    assert jail.JailProvider.availability() == (True, "ok")
    assert jail.JailProvider.availability() == (True, "ok")  # a success stays cached (no third probe)
