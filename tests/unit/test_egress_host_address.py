"""An address the host gained after the gateway read its table is denied at once.

The gateway keeps a 5-s table of the host's addresses; ``is_host_address`` also asks the kernel
(bind succeeds only for a local address), so the table's age is never a window.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess

import pytest

from execbox.egress import policy

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="adding an interface address needs root")


def test_a_new_host_address_is_denied_before_the_table_refreshes():
    name = f"exbha{os.getpid() % 100000}"
    addr = ipaddress.IPv4Address("198.51.100.77")
    policy.host_addresses()  # the table is fresh and does not have the address yet
    assert addr not in policy.host_addresses()
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        assert addr not in policy.host_addresses()  # still the old table
        assert policy.is_host_address(addr)
        ok, why = policy.parse_policy("open").ip_allowed(addr, 80)
        assert not ok and "address of the host" in why
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)
    assert not policy.is_host_address(addr)
