"""Egress for Docker boxes: the container starts with network "none", then its namespace is
configured exactly like a jail box's (boxes/netns.py) and joined to the egress gateway.

Why not a Docker network: a bridge (even ``internal``) puts every box on one L2 segment with the
others and the host, so box-to-box and host isolation would rest on extra host firewall rules in
the shared root namespace. Configuring the container's own namespace keeps every rule inside it,
and the same gateway code path (SO_ORIGINAL_DST, synthetic DNS) serves jail, runc and runsc.

Under runsc the sandbox must use the host network stack for this (the ``runsc-net`` runtime,
``--network=host`` inside the container's own namespace): gVisor's netstack reads the interfaces
only once at start, before they exist.
"""

from __future__ import annotations

from typing import Any

from ..egress.gateway import gateway
from ..egress.policy import EgressPolicy
from . import netns
from .jail_net import JailNet


def attach(api: Any, container_id: str, box_name: str, policy: EgressPolicy) -> JailNet:
    """Give a started container (network "none") its gateway-only network."""
    pid = int(api.inspect_container(container_id)["State"]["Pid"])
    if pid <= 0:
        raise netns.NetnsError(f"container {box_name} is not running (no pid)")
    net = netns.adopt(pid)
    try:
        link = gateway().attach(box_name, policy, net.tcp, net.udp)
    except BaseException:
        net.close()
        raise
    return JailNet(net, link)


DNS_OPTS: dict[str, Any] = {"dns": [netns.GW_ADDR], "dns_search": [], "dns_opt": ["timeout:2", "attempts:2"]}
"""Container create kwargs: /etc/resolv.conf points at the gateway (queries to any address on
port 53 reach it anyway)."""
