"""A session's narrowing never opens what its ceiling keeps shut (always-denied ranges, host
addresses), and bad input (odd digits, newlines, a secret of the wrong type) is SB002 that names
the entry without the secret. Found by trying to break it: an `open` provider let a session
"narrow" to 169.254.169.254/32 and reach it."""

from __future__ import annotations

import ipaddress

import pytest

from execbox.egress import policy as pol
from execbox.egress.policy import EgressDenied, parse_policy
from execbox.errors import InvalidConfigError

OPEN = parse_policy("open")


@pytest.mark.parametrize("entry", ["169.254.169.254/32:80", "127.0.0.1/32:8000", "10.0.0.0/8", "10.250.0.0/24:80",
                                   "192.168.1.1:443", "198.18.0.1:80"])
def test_open_ceiling_refuses_an_entry_that_would_open_a_denied_range(entry):
    requested = parse_policy("allowlist", [entry])
    assert requested.ip_allowed(requested.allow[0].network.network_address, requested.allow[0].ports[0])[0]
    with pytest.raises(EgressDenied) as e:
        OPEN.narrow(requested)
    assert e.value.http_status == 403 and e.value.details["entry"] == requested.allow[0].text()


def test_open_ceiling_refuses_a_host_address(monkeypatch):
    host = ipaddress.IPv4Address("203.0.113.9")  # public-looking, made an address of "this host"
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset({host}))
    with pytest.raises(EgressDenied):
        OPEN.narrow(parse_policy("allowlist", ["203.0.113.9/32:18080"]))
    ok = OPEN.narrow(parse_policy("allowlist", ["203.0.113.0/24:80", "api.example.com"]))
    assert [e.text() for e in ok.allow] == ["203.0.113.0/24:80", "api.example.com:80|443"]
    assert not ok.ip_allowed(host, 80)[0]  # the /24 does not unlock the host's own address


def test_a_public_cidr_ceiling_does_not_cover_a_private_part():
    wide = parse_policy("allowlist", ["8.0.0.0/5:80"])  # 8.0.0.0-15.255.255.255 holds 10.0.0.0/8
    with pytest.raises(EgressDenied):
        wide.narrow(parse_policy("allowlist", ["10.250.0.0/24:80"]))
    assert wide.narrow(parse_policy("allowlist", ["9.0.0.0/8:80"])).allow[0].text() == "9.0.0.0/8:80"
    operator = parse_policy("allowlist", ["10.0.0.0/8:80"])  # the operator opened 10/8 on purpose
    narrowed = operator.narrow(parse_policy("allowlist", ["10.250.0.0/24:80"]))
    assert narrowed.ip_allowed(ipaddress.IPv4Address("10.250.0.5"), 80)[0]


def test_a_tenant_cap_under_an_open_provider_opens_nothing_denied():
    cap = parse_policy("allowlist", ["10.0.0.0/8:80", "203.0.113.0/24:80"])
    both = OPEN.intersect(cap)
    assert [e.text() for e in both.allow] == ["203.0.113.0/24:80"]
    assert not both.ip_allowed(ipaddress.IPv4Address("10.1.2.3"), 80)[0]
    wide = parse_policy("allowlist", ["8.0.0.0/5:80"])
    assert wide.intersect(parse_policy("allowlist", ["10.250.0.0/24:80"])).mode == "none"


@pytest.mark.parametrize("entry", ["api.example.com:²", "api.example.com:４４３", {"host": "a.com", "ports": ["٤٤٣"]},
                                   "api\n.example.com", "evil\n.example.com:80", "*.ex\nample.com"])
def test_non_ascii_digits_and_newlines_are_bad_input(entry):
    with pytest.raises(InvalidConfigError) as e:
        parse_policy("allowlist", [entry])
    assert e.value.code == "SB002" and e.value.http_status == 400


def test_surrounding_whitespace_is_trimmed_not_kept():
    assert [e.text() for e in parse_policy("allowlist", [" api.example.com\n", "*.example.com\n:443"]).allow] == [
        "api.example.com:80|443", "*.example.com:443"]


SECRET = "sk-live-4f1d0c9e7b2a-SECRET"


@pytest.mark.parametrize("entry", [
    {"host": "api.example.com", "headers": f"Bearer {SECRET}"},
    {"host": "api.example.com", "headers": [SECRET]},
    {"host": "api.example.com", "headers": {"Authorization": ["Bearer", SECRET]}},
    {"host": "api.example.com", "headers": {"Authorization": SECRET}, "extra": 1},
    {"host": "api.example.com", "headers": {"Authorization": SECRET}, "ports": [0]},
    {"host": "https://api.example.com", "headers": {"Authorization": SECRET}},
])
def test_errors_about_an_entry_never_carry_its_header_values(entry):
    with pytest.raises(InvalidConfigError) as e:
        parse_policy("allowlist", [entry])
    assert SECRET not in str(e.value) and SECRET not in repr(e.value.details)


def test_credentials_of_the_wrong_type_do_not_leak_through_with_credentials():
    base = parse_policy("allowlist", ["api.example.com"])
    with pytest.raises(InvalidConfigError) as e:
        pol.with_credentials(base, {"api.example.com": f"Bearer {SECRET}"})
    assert SECRET not in str(e.value) and SECRET not in repr(e.value.details)


def test_an_allow_list_has_a_size_limit():
    entries = [f"203.0.{i // 256}.{i % 256}:80" for i in range(pol.MAX_ENTRIES + 1)]
    with pytest.raises(InvalidConfigError) as e:
        parse_policy("allowlist", entries)
    assert e.value.details["max"] == pol.MAX_ENTRIES
    assert len(parse_policy("allowlist", entries[:-1]).allow) == pol.MAX_ENTRIES


def test_a_narrower_entry_for_the_credentialed_host_keeps_its_credentials():
    provider = pol.with_credentials(parse_policy("allowlist", ["api.example.com:80|443"]),
                                    {"api.example.com": {"Authorization": "Bearer S"}})
    run = parse_policy("allowlist", ["api.example.com:443"])
    both = provider.intersect(run)
    assert [e.text() for e in both.allow] == ["api.example.com:443"]
    assert both.credentials_for("api.example.com", 443) == (("Authorization", "Bearer S"),)
    assert parse_policy("allowlist", ["x.example.com"]).intersect(run).mode == "none"


def test_an_open_cap_does_not_reach_what_open_denies_on_either_side():
    provider = parse_policy("allowlist", ["10.0.0.0/8:5432", "203.0.113.0/24:80"])
    both = provider.intersect(OPEN)
    assert [e.text() for e in both.allow] == ["203.0.113.0/24:80"]
    assert OPEN.intersect(OPEN).mode == "open"
    assert parse_policy("allowlist", ["10.0.0.0/8:5432"]).intersect(OPEN).mode == "none"


def test_a_session_s_public_slash_32_does_not_reach_the_host_once_the_host_takes_that_address(monkeypatch):
    addr = ipaddress.IPv4Address("203.0.113.77")
    session = OPEN.narrow(parse_policy("allowlist", ["203.0.113.77/32:80"]))  # public when narrowed
    assert session.ip_allowed(addr, 80)[0]
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset({addr}))  # the host takes the address
    assert not session.ip_allowed(addr, 80)[0]
    operator = parse_policy("allowlist", ["203.0.113.77/32:80"])  # an operator's exact /32 reaches it
    assert operator.ip_allowed(addr, 80)[0]
    assert operator.narrow(parse_policy("allowlist", ["203.0.113.77/32:80"])).ip_allowed(addr, 80)[0]
    assert not operator.intersect(parse_policy("open")).ip_allowed(addr, 80)[0]
    wide = parse_policy("allowlist", ["203.0.113.0/24:80"])
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset())
    narrowed = wide.narrow(parse_policy("allowlist", ["203.0.113.77/32:80"]))
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset({addr}))
    assert not narrowed.ip_allowed(addr, 80)[0]
