"""Every provider URL field refuses ``user:password@`` (it is shown whole in the config, errors and
logs; a password belongs in the provider's secret field), through one shared check that never
echoes the value: self_managed ``endpoint``, e2b ``api_url``/``sandbox_url`` (and ``domain``),
aliyun ``control_endpoint``/``data_endpoint``."""

from __future__ import annotations

import pytest

from execbox.errors import InvalidConfigError
from execbox.providers import registry
from execbox.providers.schema import url_problem
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

PW = "Pr0xyPassw0rd"
BASE = {
    "self_managed": ({"endpoint": "http://127.0.0.1:9385"}, "api_key"),
    "e2b": ({"api_key": "e2b_0123456789abcdef0123", "api_url": "https://api.e2b.internal",
             "sandbox_url": "https://sb.e2b.internal"}, "api_key"),
    "aliyun_codeinterpreter": ({"access_key_id": "LTAI0123456789", "access_key_secret": "s" * 20,
                                "account_id": "1", "control_endpoint": "https://ctl.example",
                                "data_endpoint": "https://data.example"}, "access_key_secret"),
}
URL_FIELDS = [("self_managed", "endpoint"), ("e2b", "api_url"), ("e2b", "sandbox_url"),
              ("aliyun_codeinterpreter", "control_endpoint"), ("aliyun_codeinterpreter", "data_endpoint")]
WITH_CREDENTIALS = [f"https://proxyuser:{PW}@api.e2b.internal", f"http://{PW}@127.0.0.1:9/",
                    f"proxyuser:{PW}@api.e2b.internal", f"https://u:{PW}@h/x?y=1"]


@pytest.mark.parametrize("provider,field", URL_FIELDS)
@pytest.mark.parametrize("url", WITH_CREDENTIALS)
def test_credentials_in_any_provider_url_are_refused_without_echo(provider, field, url):
    base, secret_field = BASE[provider]
    cls = registry.get_provider_class(provider)
    full = {k: spec["default"] for k, spec in cls.get_config_schema().items() if "default" in spec}
    ok, why = cls().validate_config({**full, **base, field: url})
    assert not ok and why.startswith(f"{field} must not carry credentials") and secret_field in why
    assert PW not in why


@pytest.mark.parametrize("provider,field", URL_FIELDS)
def test_the_admin_api_check_names_the_field_and_stores_nothing(tmp_path, provider, field):
    store = open_store(tmp_path)
    try:
        settings = SandboxSettings(store, KeyRing(generate_key(), "test key"))
        base, _ = BASE[provider]
        with pytest.raises(InvalidConfigError) as e:
            settings.validate(provider, {**base, field: f"https://proxyuser:{PW}@host.example"})
        assert e.value.code == "SB002" and field in e.value.details["fields"]
        assert PW not in str(e.value) and PW not in repr(e.value.details)
        assert settings.stored(provider) is None
        assert settings.validate(provider, base)  # the same URLs without credentials pass
    finally:
        store.close()


@pytest.mark.parametrize("domain", [f"u:{PW}@e2b.example", f"https://{PW}@e2b.example", "e2b.example/x"])
def test_e2b_domain_must_be_a_host_name(domain):
    cls = registry.get_provider_class("e2b")
    ok, why = cls().validate_config({"api_key": "e2b_x", "region": "us", "workdir": "/home/user", "domain": domain})
    assert not ok and why.startswith("domain must be a host name") and PW not in why
    assert cls().validate_config({"api_key": "e2b_x", "region": "us", "workdir": "/home/user",
                                  "domain": "eu.e2b.example:8443"}) == (True, None)


def test_the_shared_check():
    assert url_problem("f", "https://h.example/team@x/") is None  # '@' in a path is not a credential
    assert url_problem("f", "ftp://h.example") == "f must be an http:// or https:// URL with a host"
    assert url_problem("f", "https://h.example/?token=x") == "f must not carry a query or fragment"
    assert url_problem("f", "http://[::1") == "f must be an http:// or https:// URL"
    assert url_problem("f", f"http://u:{PW}@h", secret_field="k") == (
        "f must not carry credentials (user:password@host); set k instead")
