"""An operator's exact /32 of an address of the host means the same with and without the kernel
route: the route's host firewall refuses every routed packet for the host, while the gateway lets
such a /32 reach it (docs/network.md, "Always denied"), so the route leaves it to the gateway.
Found by review: with the route on, the same entry was refused by the host's firewall."""

from __future__ import annotations

import ipaddress

from execbox.boxes import netroute
from execbox.egress import policy as pol
from execbox.egress.policy import parse_policy

HOST = ipaddress.IPv4Address("93.184.216.77")


def test_a_slash_32_of_a_host_address_keeps_the_gateway(monkeypatch):
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset({HOST}))
    policy = parse_policy("allowlist", ["93.184.216.77/32:2024", "93.184.216.78/32:80", "93.184.216.0/24:8080"])
    assert policy.ip_allowed(HOST, 2024) == (True, "explicit cidr")  # what the gateway does with it
    assert [(str(n), p) for n, p in netroute.fast_entries(policy)] == [
        ("93.184.216.0/24", (8080,)), ("93.184.216.78/32", (80,))]  # the CIDR holding it: refused on both paths
    monkeypatch.setattr(pol, "host_addresses", lambda: frozenset())  # no longer the host's: routed again
    assert ("93.184.216.77/32", (2024,)) in [(str(n), p) for n, p in netroute.fast_entries(policy)]
