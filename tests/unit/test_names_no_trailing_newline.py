"""Names checked with a pattern are whole-string matches: with re.match, "$" also accepts a
trailing newline, so "abc\\n" passed as a tenant, session, proxy host or Kubernetes quantity."""

from __future__ import annotations

import pytest

from execbox.egress.proxy_http import BadRequest, parse_target
from execbox.errors import InvalidConfigError
from execbox.service.sessions.workspace import check_name


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "a\nb"])
def test_tenant_and_session_names_refuse_newlines(name):
    with pytest.raises(InvalidConfigError):
        check_name(name, "session_id")
    assert check_name("abc", "session_id") == "abc"


@pytest.mark.parametrize("authority", ["exa\nmple.com:443", "example.com:４４３", "example.com:²"])
def test_proxy_targets_refuse_newlines_and_non_ascii_ports(authority):
    with pytest.raises(BadRequest):
        parse_target(authority, None)
    assert parse_target("Example.COM:443", None) == ("example.com", 443)
