"""The self_managed endpoint is shown in the config, errors and logs, so it never carries a
password: one is refused (SB002 naming the field) and never echoed."""

from __future__ import annotations

import pytest

from execbox.errors import InvalidConfigError
from execbox.providers.self_managed import SelfManagedProvider


@pytest.mark.parametrize("endpoint", ["http://user:S3cretPW@127.0.0.1:9385/", "https://S3cretPW@exec.example/",
                                      "user:S3cretPW@exec.example", "ftp://u:S3cretPW@h/"])
def test_credentials_in_the_endpoint_are_refused_without_echoing_them(endpoint):
    p = SelfManagedProvider()
    ok, why = p.validate_config({"endpoint": endpoint})
    assert not ok and "S3cretPW" not in why and "api_key" in why
    with pytest.raises(InvalidConfigError) as e:
        p.initialize({"endpoint": endpoint})
    assert e.value.code == "SB002" and e.value.details["field"] == "endpoint"
    assert "S3cretPW" not in str(e.value) and "S3cretPW" not in repr(e.value.details)


def test_plain_endpoints_and_an_at_sign_in_the_path_still_pass():
    p = SelfManagedProvider()
    assert p.validate_config({"endpoint": "http://127.0.0.1:9385"}) == (True, None)
    assert p.validate_config({"endpoint": "https://exec.example/team@x/"}) == (True, None)
