"""A stored secret never follows a changed destination: with a ``secret_destination`` field
(endpoint, API URL, domain) changed, a redacted or omitted secret is refused (SB002 naming the
secret), so neither /test nor /config can send the stored secret to a host the admin just typed."""

from __future__ import annotations

import pytest

from execbox.errors import InvalidConfigError
from execbox.providers import registry
from execbox.service.crypto import KeyRing, generate_key, redact
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

E2B_KEY = "e2b_live_0123456789abcdefWXYZ"
AK_ID = "LTAI0123456789abcdID00"
AK_SECRET = "akSecret0123456789abcdSECR"
SM_KEY = "sk-live-SUPERSECRET-0123456789abcd"

# provider -> (stored config, {destination field: another value}, secret fields)
CASES = {
    "self_managed": ({"endpoint": "http://127.0.0.1:9", "api_key": SM_KEY},
                     {"endpoint": "http://127.0.0.1:18734"}, ["api_key"]),
    "e2b": ({"api_key": E2B_KEY, "api_url": "http://127.0.0.1:9", "sandbox_url": "http://127.0.0.1:9"},
            {"api_url": "http://evil.example", "sandbox_url": "http://evil.example", "domain": "evil.example"},
            ["api_key"]),
    "aliyun_codeinterpreter": ({"access_key_id": AK_ID, "access_key_secret": AK_SECRET, "account_id": "1",
                                "template_name": "t"},
                               {"control_endpoint": "http://evil.example", "data_endpoint": "http://evil.example"},
                               ["access_key_id", "access_key_secret"]),
}
SECRETS = (E2B_KEY, AK_ID, AK_SECRET, SM_KEY)


@pytest.fixture
def settings(tmp_path):
    store = open_store(tmp_path)
    s = SandboxSettings(store, KeyRing(generate_key(), "test key"))
    for provider, (config, _, _) in CASES.items():
        s.save(provider, s.validate(provider, config))
    yield s
    store.close()


def test_the_destination_fields_are_declared_in_each_providers_schema():
    flagged = {p: sorted(k for k, spec in registry.get_provider_class(p).get_config_schema().items()
                         if spec.get("secret_destination")) for p in CASES}
    assert flagged == {p: sorted(moves) for p, (_, moves, _) in CASES.items()}


@pytest.mark.parametrize("provider,field", [(p, f) for p, (_, moves, _) in CASES.items() for f in moves])
@pytest.mark.parametrize("send", ["redacted", "omitted"])
def test_a_changed_destination_refuses_the_stored_secret(settings, provider, field, send):
    config, moves, secrets = CASES[provider]
    changed = dict(config, **{field: moves[field]})
    for key in secrets:
        if send == "redacted":
            changed[key] = redact(config[key])
        else:
            del changed[key]
    with pytest.raises(InvalidConfigError) as e:
        settings.validate(provider, changed)
    assert e.value.code == "SB002"
    fields = e.value.details["fields"]
    for key in secrets:
        assert fields[key] == f"re-enter {key} when {field} changes"
    assert not any(s in str(e.value) or s in repr(e.value.details) for s in SECRETS)


@pytest.mark.parametrize("provider", list(CASES))
def test_same_destination_keeps_the_stored_secret_and_a_new_one_may_go_anywhere(settings, provider):
    config, moves, secrets = CASES[provider]
    same = dict(config, **{k: redact(config[k]) for k in secrets})
    assert settings.validate(provider, same) == settings.validate(provider, config)
    moved = dict(config, **moves)  # the secrets sent again in full: allowed
    clean = settings.validate(provider, moved)
    assert all(clean[k] == config[k] for k in secrets)


def test_an_unset_destination_counts_as_its_default():
    from execbox.service.store.sandbox_settings import moved_destinations

    schema = registry.get_provider_class("self_managed").get_config_schema()
    default = schema["endpoint"]["default"]
    assert moved_destinations(schema, {}, {"endpoint": default}) == []
    assert moved_destinations(schema, {"endpoint": default}, {}) == []
    assert moved_destinations(schema, {"endpoint": "http://other:1"}, {}) == ["endpoint"]


def test_several_moved_destinations_are_all_named(settings):
    config, moves, _ = CASES["e2b"]
    with pytest.raises(InvalidConfigError) as e:
        settings.validate("e2b", dict(config, api_key=redact(E2B_KEY), **moves))
    assert e.value.details["fields"]["api_key"] == "re-enter api_key when domain and api_url and sandbox_url change"
