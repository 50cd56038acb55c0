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

from ..egress.inject import BOX_BUNDLE, BOX_ENV, BoxCA
from ..egress.policy import EgressPolicy
from . import netns
from .jail_net import JailNet
from .jail_net import attach as jail_attach


def attach(api: Any, container_id: str, box_name: str, policy: EgressPolicy, ca: BoxCA | None) -> JailNet:
    """Give a started container (network "none") its gateway-only network."""
    pid = int(api.inspect_container(container_id)["State"]["Pid"])
    if pid <= 0:
        raise netns.NetnsError(f"container {box_name} is not running (no pid)")
    return jail_attach(box_name, policy, pid=pid, ca=ca)


def ca_kwargs(ca: BoxCA) -> dict[str, Any]:
    """Create kwargs of a container whose policy injects credentials: it trusts the box's CA."""
    from docker.types import Mount

    return {"environment": dict(BOX_ENV),
            "mounts": [Mount(target=BOX_BUNDLE, source=ca.bundle, type="bind", read_only=True)]}


DNS_OPTS: dict[str, Any] = {"dns": [netns.GW_ADDR], "dns_search": [], "dns_opt": ["timeout:2", "attempts:2"]}
"""Container create kwargs: /etc/resolv.conf points at the gateway (queries to any address on
port 53 reach it anyway)."""
