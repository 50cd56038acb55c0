"""The kernel route: IP-literal allow entries leave a box through the host's forwarding path.

Why: through the gateway every byte crosses a second TCP connection (box -> gateway -> upstream),
which on a small machine costs about a third of the throughput (docs/network.md). For an allow
entry that names public addresses by IP/CIDR there is nothing for the gateway to decide per
connection beyond "destination and port in the list", which netfilter checks as well; so such
connections are routed by the kernel and audited from the box's conntrack events
(egress/conntrack.py). Hostname entries, ``open``, credential injection and CIDRs that touch an
always-denied range keep going through the gateway.

Layout per box (only when the host already forwards IPv4, ``net.ipv4.ip_forward=1``, as every
Docker or Kubernetes host does: execbox never turns routing on for a host):

- the box's veth peer ``exh<pid>-<n>`` (hex) lives in the host's namespace; the pair gets a /31
  of 198.18.0.0/17 (inside the always-denied 198.18.0.0/15), unique on the host: the host's end
  is the box's next hop, the other address is the box's;
- filter FORWARD jumps to ``EXB-FWD`` for anything in or out of an ``exh+`` interface (these two
  jumps, the INPUT and the nat PREROUTING rules below are put back at the top of their chains
  whenever a box's route is set up and they are not: Docker inserts its own FORWARD rules first
  when it (re)starts); there each
  box has its chain ``EXB-<pid>-<n>``: a byte quota (the box's remaining byte cap; past it the
  box's packets get resets, chain ``EXB-<pid>-<n>-x``), packets of established connections, a
  connection cap, then ACCEPT of new connections only to the listed CIDRs and ports and from the
  box's own address; the rest is refused (tcp-reset) and ``EXB-FWD`` ends in DROP;
- nat PREROUTING returns at once for anything from ``exh+`` (so no nat rule, e.g. Docker's port
  DNAT, maps a box's packet anywhere), and filter INPUT refuses it (TCP: a reset, so the box
  sees "connection refused" at once): no listed CIDR reaches the host itself;
- nat POSTROUTING masquerades 198.18.0.0/17.

The box's own namespace (boxes/netns.py) sends only those destinations out of its veth and still
REDIRECTs everything else to the gateway, so each rule set is enough on its own: code that could
change the rules of its namespace would still meet the host's. Established connections pass the
host's chain without a destination check; a narrowing therefore deletes the host's conntrack
entries of the box's connections no longer listed (``Route.cut``), as well as the box's own.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import shutil
import subprocess
import threading
from dataclasses import dataclass

from ..egress import conntrack
from ..egress.policy import ALWAYS_DENIED, EgressPolicy, is_host_address

log = logging.getLogger("execbox.netroute")

BOX_NET = ipaddress.ip_network("198.18.0.0/17")
IF_PREFIX = "exh"
CHAIN_PREFIX = "EXB-"
DISPATCH = "EXB-FWD"
OVER_SUFFIX = "-x"
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_base_lock = threading.Lock()
_base_done = False

FastEntry = tuple[ipaddress.IPv4Network, tuple[int, ...]]


class RouteError(RuntimeError):
    pass


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20,  # noqa: S603
                          env=_ENV)
    if check and proc.returncode != 0:
        raise RouteError(f"{' '.join(argv[:4])}... failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc


def available() -> tuple[bool, str]:
    """Is the kernel route usable here? Off with ``EXECBOX_EGRESS_KERNEL_ROUTE=0``."""
    if os.environ.get("EXECBOX_EGRESS_KERNEL_ROUTE", "1").strip() == "0":
        return False, "turned off (EXECBOX_EGRESS_KERNEL_ROUTE=0)"
    try:
        with open("/proc/sys/net/ipv4/ip_forward", encoding="ascii") as f:
            if f.read().strip() != "1":
                return False, "the host does not forward IPv4 (net.ipv4.ip_forward=0); execbox leaves that alone"
    except OSError as e:
        return False, f"cannot read net.ipv4.ip_forward: {e}"
    return True, "ok"


def fast_entries(policy: EgressPolicy | None) -> tuple[FastEntry, ...]:
    """The policy's entries the kernel route may carry: IP/CIDR entries of an allowlist that
    overlap no always-denied range (those keep the gateway's finer checks), and no exact /32 of
    an address of the host: the host's INPUT rule refuses every routed packet for the host, while
    the gateway lets an operator's /32 reach it (docs/network.md), so such an entry keeps the
    gateway and means the same with or without the route. (A wider CIDR holding a host address
    is refused that address on both paths.)"""
    if policy is None or policy.mode != "allowlist":
        return ()
    out = []
    for e in policy.allow:
        if e.network is not None and not any(e.network.overlaps(d) for d in ALWAYS_DENIED) and not (
                e.network.prefixlen == 32 and is_host_address(e.network.network_address)):
            out.append((e.network, tuple(sorted(e.ports))))
    return tuple(sorted(set(out), key=lambda x: (int(x[0].network_address), x[0].prefixlen, x[1])))


# rules that must come first in their chains (table, chain, rules in order, as ``iptables -S`` prints
# them): a rule another service inserted above them (Docker's DOCKER-USER and DOCKER jumps after a
# restart, a firewall reload) could accept a box's packet before execbox's rules see it
TOP = (("filter", "FORWARD", (f"-i {IF_PREFIX}+ -j {DISPATCH}", f"-o {IF_PREFIX}+ -j {DISPATCH}")),
       ("filter", "INPUT", (f"-i {IF_PREFIX}+ -p tcp -j REJECT --reject-with tcp-reset", f"-i {IF_PREFIX}+ -j DROP")),
       ("nat", "PREROUTING", (f"-i {IF_PREFIX}+ -j RETURN",)))


def allows(entries: tuple[FastEntry, ...], dst: str, port: int) -> bool:
    """Do ``entries`` route a TCP connection to ``dst``:``port``?"""
    ip = ipaddress.IPv4Address(dst)
    return any(ip in net and port in ports for net, ports in entries)


def _ensure_base() -> None:
    """The shared chains and rules (idempotent; several execbox processes may share a host); the
    ``TOP`` rules are checked on every call, i.e. for every box."""
    global _base_done
    with _base_lock:
        if not _base_done:
            _make_dispatch()
            masq = ["-s", str(BOX_NET), "!", "-o", f"{IF_PREFIX}+", "-j", "MASQUERADE"]
            if _run(["iptables", "-w", "-t", "nat", "-C", "POSTROUTING", *masq], check=False).returncode != 0:
                _run(["iptables", "-w", "-t", "nat", "-I", "POSTROUTING", "1", *masq])
            _base_done = True
        for attempt in range(3):
            try:
                _ensure_top()
                return
            except RouteError:
                if attempt == 2:
                    raise
                _make_dispatch()  # the dispatch chain itself may be gone (a firewall reload)


def _make_dispatch() -> None:
    if _run(["iptables", "-w", "-n", "-L", DISPATCH], check=False).returncode != 0:
        _run(["iptables", "-w", "-N", DISPATCH], check=False)
        _run(["iptables", "-w", "-A", DISPATCH, "-j", "DROP"], check=False)


def _ensure_top() -> None:
    """Put the ``TOP`` rules first in their chains, in one transaction per table, where they are
    not (one ``iptables -S`` per chain when all is well, i.e. per box set-up)."""
    batches: dict[str, list[str]] = {}
    for table, chain, rules in TOP:
        have = [line[len(f"-A {chain} "):] for line in
                _run(["iptables", "-w", "-t", table, "-S", chain]).stdout.splitlines()
                if line.startswith(f"-A {chain} ")]
        if tuple(have[:len(rules)]) == rules:
            continue
        ops = batches.setdefault(table, [])
        ops += [f"-D {chain} {r}" for r in rules for _ in range(have.count(r))]
        ops += [f"-I {chain} 1 {r}" for r in reversed(rules)]
    for table, ops in batches.items():
        log.info("kernel route: putting execbox's rules back at the top of %s", table)
        _run(["iptables-restore", "-w", "--noflush"], f"*{table}\n" + "\n".join(ops) + "\nCOMMIT\n")


@dataclass
class Route:
    """One box's host side: its interface, address and FORWARD chain."""

    box_id: str  # "<pid hex>-<n hex>"
    ifname: str
    addr: ipaddress.IPv4Address  # the box's end of the /31
    entries: tuple[FastEntry, ...] = ()

    @property
    def chain(self) -> str:
        return f"{CHAIN_PREFIX}{self.box_id}"

    @property
    def over(self) -> str:
        """Where packets go once the byte quota is spent."""
        return f"{self.chain}{OVER_SUFFIX}"

    def rules(self, entries: tuple[FastEntry, ...], max_connections: int, bytes_left: int) -> str:
        c, i = self.chain, self.ifname
        # every packet passes the quota and, once its connection is up, the state check only:
        # the per-packet path stays two rules (a narrowing deletes this namespace's conntrack
        # entries of the box's connections no longer listed, ``cut``, so established ones need no
        # destination check here: their next packet is judged as new, and refused)
        lines = [f"-A {c} -m quota ! --quota {max(bytes_left, 0)} -j {self.over}",
                 f"-A {c} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                 f"-A {c} -o {i} -j DROP",
                 f"-A {c} -i {i} ! -s {self.addr}/32 -j DROP",
                 f"-A {c} -i {i} -p tcp --syn -m connlimit --connlimit-above {max_connections} "
                 f"--connlimit-mask 0 -j REJECT --reject-with tcp-reset"]
        for net, ports in entries:
            lines.append(f"-A {c} -i {i} -p tcp -d {net} -m multiport --dports {','.join(map(str, ports))} -j ACCEPT")
        lines += [f"-A {c} -p tcp -j REJECT --reject-with tcp-reset", f"-A {c} -j DROP"]
        # past the byte cap: the box's own next packet (an ACK of the data still let in, or new
        # data) gets a reset, so its connections end at once with an error instead of stalling;
        # a reset can only be sent back to a packet's sender, hence the data towards the box passes
        lines += [f"-A {self.over} -i {i} -p tcp -j REJECT --reject-with tcp-reset",
                  f"-A {self.over} -o {i} -p tcp -m conntrack --ctstate ESTABLISHED -j ACCEPT",
                  f"-A {self.over} -j DROP"]
        return "\n".join(lines)

    def apply(self, entries: tuple[FastEntry, ...], max_connections: int, bytes_left: int) -> None:
        """Replace the chains' rules in one transaction (declaring a chain flushes it)."""
        _run(["iptables-restore", "-w", "--noflush"],
             f"*filter\n:{self.chain} - [0:0]\n:{self.over} - [0:0]\n"
             f"{self.rules(entries, max_connections, bytes_left)}\nCOMMIT\n")
        self.entries = entries

    def cut(self) -> int:
        """Delete the host's conntrack entries of this box's connections that ``entries`` no longer
        route. Their next packet is then judged again: the box's is refused (reset) for its
        destination, the remote side's (addressed to the host's masquerading address) finds no
        connection and is refused by the host's own stack or dropped. Returns how many."""
        sock = conntrack.query_socket()
        try:
            return conntrack.cut(sock, lambda dst, port: allows(self.entries, dst, port), src=str(self.addr))
        finally:
            sock.close()

    def remove(self) -> None:
        for args in (["-D", DISPATCH, "-i", self.ifname, "-j", self.chain],
                     ["-D", DISPATCH, "-o", self.ifname, "-j", self.chain],
                     ["-F", self.chain], ["-F", self.over], ["-X", self.chain], ["-X", self.over]):
            _run(["iptables", "-w", "-t", "filter", *args], check=False)
        _run(["ip", "link", "del", self.ifname], check=False)  # gone with the namespace, usually


def create(box_id: str, ns_name: str, entries: tuple[FastEntry, ...], max_connections: int,
           bytes_left: int) -> Route:
    """The host side of a box's kernel route; the box-side address is set by the caller."""
    _ensure_base()
    ifname = f"{IF_PREFIX}{box_id}"
    if len(ifname) > 15:
        raise RouteError(f"interface name {ifname!r} is too long")
    _run(["ip", "link", "add", ifname, "type", "veth", "peer", "name", "eb0", "netns", ns_name])
    route = Route(box_id, ifname, ipaddress.IPv4Address(0))
    try:
        _run(["ip", "link", "set", ifname, "up"])
        route.addr = _claim_pair(ifname) + 1
        route.apply(entries, max_connections, bytes_left)
        jumps = "".join(f"-I {DISPATCH} 1 {d} {ifname} -j {route.chain}\n" for d in ("-i", "-o"))
        _run(["iptables-restore", "-w", "--noflush"], f"*filter\n{jumps}COMMIT\n")
    except BaseException:
        route.remove()
        raise
    return route


def _claim_pair(ifname: str) -> ipaddress.IPv4Address:
    """A /31 no other box on the host has; returns the host's end, now set on ``ifname``.

    The host's routing table is the registry (adding a route that exists fails), so concurrent
    execbox processes never collide."""
    pairs = BOX_NET.num_addresses // 2
    start = random.randrange(pairs)  # noqa: S311 - spreading, not security
    for k in range(pairs):
        host = BOX_NET[2 * ((start + k) % pairs)]
        proc = _run(["ip", "route", "add", f"{host}/31", "dev", ifname], check=False)
        if proc.returncode == 0:
            _run(["ip", "addr", "add", f"{host}/32", "dev", ifname])
            return host
        if "File exists" not in proc.stderr:
            raise RouteError(f"ip route add {host}/31 failed: {proc.stderr.strip()[-300:]}")
    raise RouteError(f"no free box address pair left in {BOX_NET}")


def reap_stale(live_pid: int | None = None) -> list[str]:
    """Remove box chains (and their dispatch jumps) of execbox processes that are gone."""
    out: list[str] = []
    if shutil.which("iptables-save", path=_ENV["PATH"]) is None:
        return out  # no iptables, so no box of this host ever had a route
    proc = _run(["iptables-save", "-t", "filter"], check=False)
    if proc.returncode != 0:
        return out
    for line in proc.stdout.splitlines():
        if not line.startswith(f":{CHAIN_PREFIX}") or line.startswith(f":{DISPATCH} "):
            continue
        chain = line[1:].split()[0]
        if chain.endswith(OVER_SUFFIX):
            continue  # removed with its box's chain
        box_id = chain[len(CHAIN_PREFIX):]
        try:
            pid = int(box_id.split("-")[0], 16)
        except ValueError:
            continue
        if pid != live_pid and not os.path.exists(f"/proc/{pid}"):
            Route(box_id, f"{IF_PREFIX}{box_id}", ipaddress.IPv4Address(0)).remove()
            out.append(chain)
    return out
