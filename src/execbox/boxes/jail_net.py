"""Networking of one jail box: its namespace (boxes/netns.py) joined to the egress gateway.

Kept apart from jail_box.py so the box start path only gains three calls: ``attach`` before the
spawn, ``preexec`` around the child's set-up, ``detach`` at teardown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..egress.gateway import BoxLink, Limits, gateway
from ..egress.inject import BOX_BUNDLE, BOX_ENV, BoxCA, Injector
from ..egress.policy import EgressPolicy, has_credentials
from . import netns, netroute
from .bwrap import ETC_FILES, staged_etc

RESOLV_CONF = f"nameserver {netns.GW_ADDR}\noptions timeout:2 attempts:2\n"


@dataclass
class JailNet:
    net: netns.BoxNet
    link: BoxLink
    ca: BoxCA | None = None  # per-box CA when the policy injects credentials

    def detach(self) -> None:
        try:
            gateway().detach(self.link)
        finally:
            self.net.close()
            if self.ca is not None:
                self.ca.close()

    def box_env(self) -> dict[str, str]:
        return dict(BOX_ENV) if self.ca is not None else {}


def new_ca(box_name: str, policy: EgressPolicy | None) -> BoxCA | None:
    return BoxCA(box_name) if has_credentials(policy) else None


def wanted(policy: EgressPolicy | None) -> bool:
    return policy is not None and policy.mode != "none"


def route_spec(policy: EgressPolicy, limits: Limits) -> netns.RouteSpec | None:
    """A kernel route when the policy lists public IPs/CIDRs and the host forwards (netroute.py).

    Decided once per box from the policy it starts with (pool boxes: the provider's); sessions
    only narrow it, and a narrowed policy re-points the route (``BoxLink.on_policy``)."""
    fast = netroute.fast_entries(policy)
    if not fast or not netroute.available()[0]:
        return None
    return netns.RouteSpec(fast, limits.max_connections, limits.max_bytes)


def attach(box_name: str, policy: EgressPolicy, *, pid: int | None = None, ca: BoxCA | None = None,
           limits: Limits | None = None) -> JailNet:
    """A new namespace (or, with ``pid``, that process's) joined to the gateway under ``policy``;
    ``limits``: the per-box caps, default ``Limits.from_env()`` (a template build's box: its own)."""
    limits = limits or Limits.from_env()
    spec = route_spec(policy, limits)
    try:
        net = netns.adopt(pid, spec) if pid is not None else netns.create(spec)
    except BaseException:
        if ca is not None:
            ca.close()
        raise
    jn = JailNet(net, None, ca)  # type: ignore[arg-type]
    try:
        jn.link = gateway().attach(box_name, policy, net.tcp, net.udp, limits, ct=net.ct,
                                   box_addr=str(net.route.addr) if net.route is not None else None,
                                   capped=net.capped, spent=net.spent)
        if net.route is not None:
            jn.link.on_policy = lambda p, link=jn.link: net.set_fast(
                netroute.fast_entries(p), link.limits.max_connections, link.limits.max_bytes - link.bytes_total)
        if ca is not None:
            jn.link.intercept = Injector(ca)
    except BaseException:
        if jn.link is not None:
            jn.detach()
        else:
            net.close()
            if ca is not None:
                ca.close()
        raise
    return jn


def preexec(inner: Any, jn: JailNet | None):  # type: ignore[no-untyped-def]
    """Wrap the child's pre-exec: join the box's namespace first (while still root)."""
    if jn is None:
        return inner
    fd = jn.net.fd

    def run() -> None:
        netns.join(fd)
        inner()

    return run


def staged_etc_net() -> str:
    """Like bwrap.staged_etc, but names resolve through DNS (the gateway) too, and the host's
    public CA bundle can be bound at /etc/ssl/certs."""
    return staged_etc("box-etc-net", {**ETC_FILES, "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
                                      "resolv.conf": RESOLV_CONF}, mount_points=("ssl/certs",))


def extra_mounts(jn: JailNet) -> list[tuple[str, str]]:
    out = []
    if os.path.isdir("/etc/ssl/certs"):
        out.append(("/etc/ssl/certs", "/etc/ssl/certs"))  # public CA bundle only, never /etc/ssl/private
    if jn.ca is not None:
        out.append((jn.ca.bundle, BOX_BUNDLE))  # host bundle + this box's CA, over the usual path
    return out
