"""The egress policy model: every malformed entry refused naming it; sessions only narrow."""

from __future__ import annotations

import ipaddress

import pytest

from execbox.egress.policy import EgressDenied, parse_policy
from execbox.errors import InvalidConfigError


@pytest.mark.parametrize("entry", [
    "10.0.0.0/33", "300.1.2.3", "10.0.0.1/8", "*", "*foo.com", "https://example.com/x", "example.com/path",
    "example.com:0", "example.com:70000", "example.com:http", "exa mple.com", "[::1]:80", "2001:db8::/32",
    "0.0.0.0/0", "", "-bad.com", {"host": "a.com", "ports": [0]}, {"host": "a.com", "evil": 1}, 42,
    {"host": "*.a.com", "headers": {"X-Key": "v"}}, {"host": "1.2.3.4", "headers": {"X-Key": "v"}},
    {"host": "a.com", "headers": {"X-Key": "v\r\nInjected: 1"}},
])
def test_bad_entries_are_refused_naming_the_entry(entry):
    with pytest.raises(InvalidConfigError) as e:
        parse_policy("allowlist", [entry])
    assert e.value.code == "SB002" and e.value.http_status == 400
    assert e.value.details["field"] == "network_allow" and "entry" in e.value.details


def test_good_entries_and_defaults():
    p = parse_policy("allowlist", ["API.Example.com", "*.pypi.org:443", "203.0.113.0/24:80|8080",
                                   {"host": "x.com", "ports": [22]}])
    assert [e.text() for e in p.allow] == ["api.example.com:80|443", "*.pypi.org:443", "203.0.113.0/24:80|8080",
                                           "x.com:22"]
    assert p.name_allowed("api.example.com", 443) and not p.name_allowed("api.example.com", 22)
    assert p.name_allowed("files.pypi.org", 443) and not p.name_allowed("pypi.org", 443)
    assert not p.name_allowed("evilpypi.org", 443)
    assert p.ip_allowed(ipaddress.IPv4Address("203.0.113.7"), 8080)[0]
    assert not p.ip_allowed(ipaddress.IPv4Address("203.0.114.7"), 80)[0]


def test_mode_errors():
    with pytest.raises(InvalidConfigError):
        parse_policy("sometimes")
    with pytest.raises(InvalidConfigError):
        parse_policy("open", ["a.com"])


@pytest.mark.parametrize("ip", ["127.0.0.1", "10.1.2.3", "172.20.0.1", "192.168.1.1", "169.254.169.254",
                                "100.64.0.1", "224.0.0.1", "0.0.0.0", "198.18.255.1"])
def test_special_ranges_denied_even_when_open_or_via_name(ip):
    addr = ipaddress.IPv4Address(ip)
    assert not parse_policy("open").ip_allowed(addr, 80)[0]
    assert not parse_policy("allowlist", ["a.com"]).ip_allowed(addr, 80, via_name=True)[0]


def test_exact_cidr_unlocks_only_its_part_of_a_private_range():
    p = parse_policy("allowlist", ["10.1.2.0/24:5432", "8.8.8.0/24"])
    assert p.ip_allowed(ipaddress.IPv4Address("10.1.2.9"), 5432)[0]
    assert not p.ip_allowed(ipaddress.IPv4Address("10.1.3.9"), 5432)[0]
    assert not p.ip_allowed(ipaddress.IPv4Address("10.1.2.9"), 80)[0]
    assert not parse_policy("allowlist", ["8.0.0.0/5"]).ip_allowed(ipaddress.IPv4Address("10.0.0.1"), 80)[0]


def test_narrowing_never_widens():
    cap = parse_policy("allowlist", ["*.example.com:443", "203.0.113.0/24"])
    assert cap.narrow(parse_policy("none")).mode == "none"
    assert cap.narrow(parse_policy("allowlist", ["api.example.com:443"])).allow[0].host == "api.example.com"
    assert cap.narrow(parse_policy("allowlist", ["203.0.113.8/29:80"])).allow[0].ports == (80,)
    for wider in (parse_policy("open"), parse_policy("allowlist", ["api.example.com:80"]),
                  parse_policy("allowlist", ["other.com"]), parse_policy("allowlist", ["203.0.0.0/16"])):
        with pytest.raises(EgressDenied) as e:
            cap.narrow(wider)
        assert e.value.http_status == 403
    with pytest.raises(EgressDenied):
        parse_policy("none").narrow(parse_policy("allowlist", ["a.com"]))


def test_credentials_come_only_from_the_cap():
    cap = parse_policy("allowlist", [{"host": "api.example.com", "headers": {"Authorization": "Bearer s3cret"}}])
    assert cap.credentials_for("api.example.com", 443) == (("Authorization", "Bearer s3cret"),)
    narrowed = cap.narrow(parse_policy("allowlist", ["api.example.com:443"]))
    assert narrowed.credentials_for("api.example.com", 443)
    assert "s3cret" not in str(cap.to_dict())
