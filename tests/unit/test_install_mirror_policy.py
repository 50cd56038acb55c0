"""An operator's internal package mirror is reachable during an in-session install: its name
resolves into a private range, which no hostname entry reaches, so the step allows exactly the
addresses it resolves to (on its port), and nothing else of that range."""

from __future__ import annotations

import ipaddress

from execbox.providers import install


def test_a_mirror_on_a_private_address_is_reachable_for_the_step_only_there(monkeypatch):
    monkeypatch.setattr("execbox.egress.resolver.resolve_sync",
                        lambda name: [ipaddress.IPv4Address("10.20.0.5"), ipaddress.IPv4Address("203.0.113.9")])
    step = install.index_hosts("http://devpi.corp.internal:3141/root/pypi/+simple/", None, True, False)
    assert [e.text() for e in step.allow] == ["devpi.corp.internal:3141", "10.20.0.5/32:3141"]
    assert step.name_allowed("devpi.corp.internal", 3141)
    assert step.ip_allowed(ipaddress.IPv4Address("10.20.0.5"), 3141, via_name=True)[0]
    assert not step.ip_allowed(ipaddress.IPv4Address("10.20.0.6"), 3141, via_name=True)[0]
    assert not step.ip_allowed(ipaddress.IPv4Address("10.20.0.5"), 22)[0]


def test_public_mirrors_and_defaults_get_hostname_entries_only(monkeypatch):
    monkeypatch.setattr("execbox.egress.resolver.resolve_sync", lambda name: [ipaddress.IPv4Address("203.0.113.9")])
    step = install.index_hosts("https://mirror.example.org/simple/", None, True, True)
    assert [e.text() for e in step.allow] == ["mirror.example.org:443", "registry.npmjs.org:443"]
    step = install.index_hosts("http://10.1.2.3:8080/simple/", None, True, False)
    assert [e.text() for e in step.allow] == ["10.1.2.3/32:8080"]
