"""Review 50, F4: what the first boot seeds from the environment passes the admin API's
validation before anything is written. A value that cannot be used is SB002 naming the variable
(nothing stored, so fixing the environment fixes the next boot); SANDBOX_TIMEOUT_SEC above a
provider's maximum is lowered to it with a warning; later boots warn that the first-boot-only
variables set are ignored."""

from __future__ import annotations

import json
import logging

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

SEED = {"system_settings": [
    {"name": "sandbox.provider_type", "source": "variable", "data_type": "string", "value": ""},
    {"name": "sandbox.fallback", "source": "variable", "data_type": "json", "value": "[]"},
    {"name": "sandbox.jail", "source": "variable", "data_type": "json", "value": "{\"timeout\": 30}"},
    {"name": "sandbox.aliyun_codeinterpreter", "source": "variable", "data_type": "json",
     "value": "{\"region\": \"cn-hangzhou\", \"timeout\": 30}"},
]}


@pytest.fixture
def seed(tmp_path):
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED))
    return path


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "data")
    yield s
    s.close()


def settings(store) -> SandboxSettings:
    return SandboxSettings(store, KeyRing(generate_key()))


def test_unusable_env_values_are_sb002_naming_the_variable_and_nothing_is_stored(store, seed):
    env = {"EXECBOX_JAIL_TIMEOUT": "abc", "EXECBOX_JAIL_PIDS_LIMIT": "-5", "SANDBOX_TYPE": "jail"}
    with pytest.raises(InvalidConfigError) as e:
        settings(store).seed(seed, env)
    assert "EXECBOX_JAIL_TIMEOUT" in e.value.message and "EXECBOX_JAIL_PIDS_LIMIT" in e.value.message
    assert e.value.details["fields"]["EXECBOX_JAIL_TIMEOUT"] == "jail timeout: must be an integer"
    assert "pids_limit: must be >=" in e.value.details["fields"]["EXECBOX_JAIL_PIDS_LIMIT"]
    assert store.settings.all() == {}  # not even the active row: the next boot seeds again
    assert settings(store).seed(seed, {"SANDBOX_TYPE": "jail"})  # the environment fixed: it starts
    assert settings(store).check_stored("jail")["timeout"] == 30


def test_a_providers_own_timeout_above_its_max_is_refused_not_lowered(store, seed):
    for env, message in (({"EXECBOX_JAIL_TIMEOUT": "7200"}, "jail timeout: must be <= 3600"),
                         ({"EXECBOX_JAIL_TIMEOUT": "600", "EXECBOX_JAIL_MAX_TIMEOUT": "60"},
                          "jail timeout: must be <= max_timeout (60)")):
        with pytest.raises(InvalidConfigError) as e:
            settings(store).seed(seed, env)
        assert e.value.details["fields"] == {"EXECBOX_JAIL_TIMEOUT": message}
        assert store.settings.all() == {}


def test_a_provider_check_names_the_variable_once(store, seed):
    with pytest.raises(InvalidConfigError) as e:
        settings(store).seed(seed, {"EXECBOX_JAIL_NETWORK_ALLOW": "pypi.org"})  # needs network=allowlist
    message = e.value.details["fields"]["EXECBOX_JAIL_NETWORK_ALLOW"]
    assert message.startswith("jail network_allow: network_allow entries need")


def test_a_secret_that_is_no_header_value_names_the_variable_not_the_value(store, seed):
    with pytest.raises(InvalidConfigError) as e:
        settings(store).seed(seed, {"E2B_API_KEY": "e2b_0123\x01456789"})
    assert list(e.value.details["fields"]) == ["E2B_API_KEY"] and "0123" not in str(e.value.details)
    assert store.settings.all() == {}


def test_seeded_values_are_stored_as_the_api_would_store_them(store, seed):
    s = settings(store)
    assert s.seed(seed, {"EXECBOX_JAIL_TIMEOUT": "60", "EXECBOX_JAIL_NETWORK": "allowlist",
                         "EXECBOX_JAIL_NETWORK_ALLOW": "pypi.org, example.com"})
    assert s.stored("jail") == {"timeout": 60, "network": "allowlist", "network_allow": ["pypi.org", "example.com"]}
    assert s.stored("aliyun_codeinterpreter") == {"region": "cn-hangzhou", "timeout": 30}  # incomplete is fine
    assert s.stored("e2b") is None


def test_sandbox_timeout_sec_above_a_providers_max_is_lowered_with_a_warning(store, seed, caplog):
    s = settings(store)
    with caplog.at_level(logging.WARNING, logger="execbox.config"):
        assert s.seed(seed, {"SANDBOX_TIMEOUT_SEC": "2h", "SANDBOX_TYPE": "jail"})
    assert s.stored("jail")["timeout"] == 3600 and s.check_stored("jail")["timeout"] == 3600  # serve starts
    assert s.stored("aliyun_codeinterpreter")["timeout"] == 30  # aliyun's max, not left unusable
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "SANDBOX_TIMEOUT_SEC=2h" in warning and "aliyun_codeinterpreter (30s)" in warning
    assert "jail (3600s)" in warning


def test_sandbox_timeout_sec_is_lowered_to_a_seeded_max_timeout(store, seed, caplog):
    s = settings(store)
    with caplog.at_level(logging.WARNING, logger="execbox.config"):
        assert s.seed(seed, {"SANDBOX_TIMEOUT_SEC": "20", "EXECBOX_JAIL_MAX_TIMEOUT": "15"})
    assert s.stored("jail") == {"timeout": 15, "max_timeout": 15}
    assert s.stored("aliyun_codeinterpreter")["timeout"] == 20  # under its max: as given, no warning
    assert "jail (15s)" in caplog.text and "aliyun" not in caplog.text


def test_later_boots_warn_that_first_boot_variables_are_ignored(store, seed, caplog):
    ProviderManager(store, keyring=KeyRing(generate_key()), env={}, seed_file=seed).shutdown()
    env = {"SANDBOX_TIMEOUT_SEC": "5", "EXECBOX_JAIL_TIMEOUT": "9", "E2B_API_KEY": "e2b_0123456789",
           "AGENTRUN_REGION": "cn-beijing", "EXECBOX_E2B_DOMAIN": "sandbox.example.com"}
    with caplog.at_level(logging.WARNING, logger="execbox.config"):
        ProviderManager(store, keyring=KeyRing(generate_key()), env=env, seed_file=seed).shutdown()
    ignored = [r.getMessage() for r in caplog.records if "only read on first boot" in r.getMessage()]
    assert len(ignored) == 1, caplog.text
    assert ignored[0].startswith("SANDBOX_TIMEOUT_SEC, E2B_API_KEY, EXECBOX_JAIL_TIMEOUT are ignored")
    # still read later: aliyun falls back to AGENTRUN_*; EXECBOX_E2B_DOMAIN is the E2B API's domain
    assert "AGENTRUN_REGION" not in ignored[0] and "EXECBOX_E2B_DOMAIN" not in ignored[0]
    assert settings(store).stored("jail") == {"timeout": 30}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="execbox.config"):
        ProviderManager(store, keyring=KeyRing(generate_key()), env={"AGENTRUN_REGION": "x"},
                        seed_file=seed).shutdown()
    assert "only read on first boot" not in caplog.text
