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
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("execbox.netns")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
GW_TCP_PORT = 15001
GW_DNS_PORT = 15053
BOX_ADDR = "198.18.255.2"
GW_ADDR = "198.18.255.1"
PREFIX = "exb-"

_counter = itertools.count(1)
_ns_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execbox-netns")
_libc = ctypes.CDLL(None, use_errno=True)

IPTABLES_RULES = f"""*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A OUTPUT -p tcp ! -d 127.0.0.0/8 -j REDIRECT --to-ports {GW_TCP_PORT}
-A OUTPUT -p udp ! -d 127.0.0.0/8 --dport 53 -j REDIRECT --to-ports {GW_DNS_PORT}
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
-A OUTPUT -d 127.0.0.0/8 -j ACCEPT
-A OUTPUT -d {BOX_ADDR}/32 -j ACCEPT
-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited
COMMIT
"""

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

    def close(self) -> None:
        for s in (self.tcp, self.udp):
            try:
                s.close()
            except OSError:
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass
        delete(self.name)


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


def _sockets() -> tuple[socket.socket, socket.socket]:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", GW_TCP_PORT))
        tcp.listen(256)
        tcp.setblocking(False)
        udp.bind(("127.0.0.1", GW_DNS_PORT))
        udp.setblocking(False)
    except OSError:
        tcp.close()
        udp.close()
        raise
    return tcp, udp


def create() -> BoxNet:
    """A fresh, fully configured namespace with the gateway's two sockets inside it."""
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    _run(["ip", "netns", "add", name])
    return _configure(name)


def adopt(pid: int) -> BoxNet:
    """Configure the (network-less) namespace of a running process, e.g. a runc container's init.

    ``ip netns attach`` gives it a name (for the rules and for ``reap_stale``); the namespace
    itself lives as long as the container does.
    """
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    _run(["ip", "netns", "attach", name, str(int(pid))])
    return _configure(name)


def _configure(name: str) -> BoxNet:
    fd = -1
    try:
        _run(["ip", "-n", name, "-batch", "-"], IP_BATCH)
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.lo.disable_ipv6=1"])
        _run(["ip", "netns", "exec", name, "iptables-restore"], IPTABLES_RULES)
        fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
        tcp, udp = _ns_thread.submit(_in_netns, fd, _sockets).result(10)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        delete(name)
        raise
    return BoxNet(name, fd, tcp, udp)


def join(fd: int) -> None:
    """In a forked child before exec: move into the box's namespace (needs root; before uid drop)."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into the box network namespace failed")


def delete(name: str) -> None:
    try:
        _run(["ip", "netns", "delete", name])
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        log.error("cannot delete network namespace %s: %s", name, e)


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
    return out

