"""The network namespace of a jail box whose policy is not ``none``: the gateway is its only exit.

Layout (all inside the box's own namespace, nothing added to the host's):

- ``lo`` up; a veth pair ``eb0``/``eb1`` with 198.18.255.2/30 on eb0 and a default route through
  it, only so that connect() to any address gets as far as the netfilter hooks;
- iptables nat OUTPUT: every TCP connection to a non-loopback address is REDIRECTed to the
  gateway's listener (127.0.0.1:15001, a socket the gateway created inside this namespace);
  UDP port 53 to the gateway's DNS socket (127.0.0.1:15053);
- filter OUTPUT: only loopback destinations (the gateway sockets, after REDIRECT) and the box's
  own address (the gateway's replies) are accepted; all else
  (other UDP, ICMP, anything) is REJECTed with "administratively prohibited";
- IPv6 disabled in the namespace (no address, no route: connect() fails with ENETUNREACH).

The box itself joins the namespace with no capability in it (it is owned by the host's user
namespace), so code inside cannot change these rules. Nothing from the host's namespaces is
reachable: the packets never leave; the gateway dials out from the service's namespace after
its checks. Names are ``exb-<service pid>-<n>`` so ``reap_stale`` can remove leftovers.

With a kernel route (boxes/netroute.py: IP-literal allow entries, on a host that forwards IPv4)
the veth's other end is in the host's namespace instead, the box's address is unique on the
host, and the listed CIDRs and ports (chains ``EXB-FAST``) are exempt from the REDIRECT and
accepted out of eb0; once established, only connections carrying the routed connmark leave
(``routed_rules``). The namespace then also keeps conntrack accounting and an event socket, from
which those connections are audited (egress/conntrack.py); its TIME_WAIT and CLOSE timeouts are
1 s so a closed connection's record arrives at once, and ``nf_conntrack_tcp_loose=0`` so a packet
of a connection it does not know (one a narrowing deleted) never re-creates it. The box's byte
and connection caps are enforced here for both paths together (the gateway's connections cross
this namespace's loopback, the routed ones its eb0).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..egress import conntrack
from . import netroute
from .netns_rules import (
    BOX_ADDR,
    GW_ADDR,
    GW_CAP_PORT,
    GW_DNS_PORT,
    GW_SPENT_PORT,
    GW_TCP_PORT,
    IPTABLES_RULES,
    ROUTED_MARK,
    ROUTED_MASK,
    ROUTED_SYSCTLS,
    fast_rules,
    routed_rules,
)

log = logging.getLogger("execbox.netns")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
PREFIX = "exb-"
CT_GROUPS = (1 << 0) | (1 << 1) | (1 << 2)  # NFNLGRP_CONNTRACK_NEW, _UPDATE, _DESTROY

_counter = itertools.count(1)
_ns_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execbox-netns")
_libc = ctypes.CDLL(None, use_errno=True)

IP_BATCH = f"""link set lo up
link add eb0 type veth peer name eb1
addr add {BOX_ADDR}/30 dev eb0
link set eb0 up
link set eb1 up
route add default via {GW_ADDR} dev eb0 onlink
"""


class NetnsError(RuntimeError):
    pass


def _run(argv: list[str], stdin: str | None = None) -> None:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20,  # noqa: S603
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv[:4])}... failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "box networking needs execbox to run as root (it creates network namespaces)"
    for tool in ("ip", "iptables-restore"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin", "/usr/bin")):
            return False, f"{tool} is not installed (apt install iproute2 iptables)"
    return True, "ok"


@dataclass
class BoxNet:
    name: str
    fd: int  # open /run/netns/<name>: the box's bwrap joins it with setns() before exec
    tcp: socket.socket
    udp: socket.socket
    route: netroute.Route | None = None  # the kernel route's host side, when the box has one
    ct: socket.socket | None = None  # conntrack events of the namespace (kernel route only)
    capped: socket.socket | None = None  # the gateway's listener for connections past the cap (same)
    spent: socket.socket | None = None  # ... and for those after the byte quota is spent (same)

    def set_fast(self, fast: tuple[netroute.FastEntry, ...], max_connections: int, bytes_left: int) -> None:
        """Re-point the kernel route at ``fast`` (a narrowed policy's entries), host side first:
        if the box's side then fails, its packets still meet the host's new rules. Then the routed
        connections open to a destination no longer listed are deleted from the conntrack tables
        of both namespaces (those still listed go on untouched): the box's next packet of one is
        unknown to its namespace and gets a reset there (and would get one from the host), the
        remote side's is addressed to a host connection that no longer exists and never reaches
        the box. Any failure raises (the caller then shuts the route)."""
        if self.route is None or fast == self.route.entries:
            return
        self.route.apply(fast, max_connections, bytes_left)
        _run(["ip", "netns", "exec", self.name, "iptables-restore", "--noflush"], fast_rules(fast))
        try:
            sock = _ns_thread.submit(_in_netns, self.fd, conntrack.query_socket).result(10)
            try:
                conntrack.cut(sock, lambda dst, port: netroute.allows(fast, dst, port), mark=(ROUTED_MARK, ROUTED_MASK))
            finally:
                sock.close()
            self.route.cut()
        except OSError as e:
            raise NetnsError(f"cannot cut the routed connections no longer allowed: {e}") from e

    def close(self) -> None:
        for s in (self.tcp, self.udp, self.ct, self.capped, self.spent):
            try:
                if s is not None:
                    s.close()
            except OSError:
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass
        delete(self.name)
        if self.route is not None:
            self.route.remove()


def _in_netns(fd: int, fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` with this (dedicated) thread inside the namespace ``fd``, then switch back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise NetnsError(f"setns: {os.strerror(ctypes.get_errno())}")
        try:
            return fn()
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:  # a thread stuck in a box's namespace is fatal
                os.abort()
    finally:
        os.close(own)


def _listener(port: int, backlog: int) -> socket.socket:
    """A non-blocking TCP listener on the namespace's loopback (the gateway serves it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(backlog)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def _sockets() -> tuple[socket.socket, socket.socket]:
    tcp = _listener(GW_TCP_PORT, 256)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind(("127.0.0.1", GW_DNS_PORT))
        udp.setblocking(False)
    except OSError:
        tcp.close()
        udp.close()
        raise
    return tcp, udp


def _routed_sockets() -> tuple[socket.socket, socket.socket, socket.socket]:
    """A routed box's conntrack event socket and the gateway's listeners for its connections past
    the connection cap and after the byte quota, all made in one visit to its namespace."""
    made: list[socket.socket] = []
    try:
        made.append(_ct_socket())
        made.append(_listener(GW_CAP_PORT, 64))
        made.append(_listener(GW_SPENT_PORT, 64))
    except OSError:
        for s in made:
            s.close()
        raise
    return made[0], made[1], made[2]


def _ct_socket() -> socket.socket:
    """A conntrack event socket (new and destroyed connections) of the calling thread's namespace."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, conntrack.NETLINK_NETFILTER)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((0, CT_GROUPS))
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


@dataclass
class RouteSpec:
    """What a box with a kernel route starts with (boxes/netroute.py)."""

    fast: tuple[netroute.FastEntry, ...]
    max_connections: int
    max_bytes: int


def create(route: RouteSpec | None = None) -> BoxNet:
    """A fresh, fully configured namespace with the gateway's two sockets inside it."""
    n = next(_counter)
    name = f"{PREFIX}{os.getpid()}-{n}"
    _run(["ip", "netns", "add", name])
    return _configure(name, n, route)


def adopt(pid: int, route: RouteSpec | None = None) -> BoxNet:
    """Configure the (network-less) namespace of a running process, e.g. a runc container's init.

    ``ip netns attach`` gives it a name (for the rules and for ``reap_stale``); the namespace
    itself lives as long as the container does.
    """
    n = next(_counter)
    name = f"{PREFIX}{os.getpid()}-{n}"
    _run(["ip", "netns", "attach", name, str(int(pid))])
    return _configure(name, n, route)


def _configure(name: str, n: int, spec: RouteSpec | None) -> BoxNet:
    fd = -1
    route: netroute.Route | None = None
    sysctls = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
               "net.ipv6.conf.lo.disable_ipv6=1"]
    try:
        if spec is not None:
            route = netroute.create(f"{os.getpid():x}-{n:x}", name, spec.fast, spec.max_connections, spec.max_bytes)
            _run(["ip", "-n", name, "-batch", "-"], f"link set lo up\naddr add {route.addr}/32 dev eb0\n"
                 f"link set eb0 up\nroute add default via {route.addr - 1} dev eb0 onlink\n")
            sysctls += ROUTED_SYSCTLS
        else:
            _run(["ip", "-n", name, "-batch", "-"], IP_BATCH)
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", *sysctls])
        _run(["ip", "netns", "exec", name, "iptables-restore"], IPTABLES_RULES if route is None or spec is None else
             routed_rules(str(route.addr), route.entries, spec.max_connections, spec.max_bytes))
        fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
        tcp, udp = _ns_thread.submit(_in_netns, fd, _sockets).result(10)
        ct: socket.socket | None = None
        capped: socket.socket | None = None
        spent: socket.socket | None = None
        if route is not None:
            ct, capped, spent = _ns_thread.submit(_in_netns, fd, _routed_sockets).result(10)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        delete(name)
        if route is not None:
            route.remove()
        raise
    return BoxNet(name, fd, tcp, udp, route, ct, capped, spent)


def join(fd: int) -> None:
    """In a forked child before exec: move into the box's namespace (needs root; before uid drop)."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into the box network namespace failed")


def delete(name: str) -> None:
    try:
        _run(["ip", "netns", "delete", name])
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        log.error("cannot delete network namespace %s: %s", name, e)


_reap_lock = threading.Lock()
_reaped = False


def reap_stale_once() -> list[str]:
    """``reap_stale`` once per process (jail and Docker providers both call it at start)."""
    global _reaped
    with _reap_lock:
        if _reaped:
            return []
        _reaped = True
    return reap_stale()


def reap_stale() -> list[str]:
    """Delete ``exb-<pid>-*`` namespaces whose owning execbox process is gone."""
    out: list[str] = []
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return out
    for n in names:
        if not n.startswith(PREFIX):
            continue
        pid = n[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            delete(n)
            out.append(n)
    try:
        out += netroute.reap_stale()
    except (netroute.RouteError, OSError, subprocess.TimeoutExpired) as e:
        log.error("cannot reap stale kernel-route chains: %s", e)
    return out

