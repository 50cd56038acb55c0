"""The iptables rule texts of a box's network namespace (boxes/netns.py sets them up).

Kept apart from the namespace's life cycle: these strings are the whole enforcement inside the
box's namespace, and each one is read (and tested) on its own.
"""

from __future__ import annotations

from ..egress import conntrack
from . import netroute

GW_TCP_PORT = 15001
GW_DNS_PORT = 15053
GW_CAP_PORT = 15002  # a routed box's connections past its cap: the gateway refuses and audits them
GW_SPENT_PORT = 15003  # a routed box's connections after its byte quota is spent: the same
SPENT_LIST = "EXB-SPENT"  # xt_recent list holding the box's address once its byte quota is spent
BOX_ADDR = "198.18.255.2"
GW_ADDR = "198.18.255.1"
ROUTED_MARK = 0x5EB  # connmark of a routed connection (set in nat OUTPUT on its first packet)
ROUTED_MASK = 0xFFFF  # the bits above are flags: conntrack.LIMITED_MARK


def iptables_rules(box_addr: str = BOX_ADDR) -> str:
    """The rule set of a namespace whose only exit is the gateway."""
    return f"""*nat
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
-A OUTPUT -d {box_addr}/32 -j ACCEPT
-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited
COMMIT
"""


IPTABLES_RULES = iptables_rules()
FAST_CHAIN = "EXB-FAST"
CAP_CHAIN = "EXB-CAP"
OVER_CHAIN = "EXB-OVER"


def _fast(fast: tuple[netroute.FastEntry, ...]) -> tuple[str, str]:
    """The rules of the nat and the filter ``EXB-FAST`` chains: the routed destinations."""
    match = [f"-p tcp -d {net} -m multiport --dports {','.join(map(str, ports))}" for net, ports in fast]
    nat = "".join(f"-A {FAST_CHAIN} {m} -j CONNMARK --set-mark {ROUTED_MARK}\n-A {FAST_CHAIN} {m} -j ACCEPT\n"
                  for m in match)
    return nat, "".join(f"-A {FAST_CHAIN} {m} -j ACCEPT\n" for m in match)


def fast_rules(fast: tuple[netroute.FastEntry, ...]) -> str:
    """For ``iptables-restore --noflush``: the two chains that name the routed destinations, all
    that a narrowing rewrites (declaring a chain flushes it; the others keep rules and counters)."""
    nat, out = _fast(fast)
    return f"*nat\n:{FAST_CHAIN} - [0:0]\n{nat}COMMIT\n*filter\n:{FAST_CHAIN} - [0:0]\n{out}COMMIT\n"


def routed_rules(box_addr: str, fast: tuple[netroute.FastEntry, ...], max_connections: int, max_bytes: int) -> str:
    """The whole rule set of a namespace with a kernel route.

    - nat: a new TCP connection to a routed destination (``EXB-FAST``) gets the routed connmark and
      no NAT; every other one is REDIRECTed to the gateway as without a route.
    - filter OUTPUT: a routed connection's packets leave eb0 only with that mark once established,
      or, new (or unknown to conntrack), to a destination still listed; any other TCP packet out of
      eb0 gets a reset (a connection that a narrowing deleted: ``nf_conntrack_tcp_loose=0`` keeps
      its next packet from being taken for a fresh connection, in either direction).
    - filter INPUT: packets from eb0 that conntrack does not know are dropped.
    - caps for both paths together (the gateway's connections and the routed ones): every new TCP
      connection to a non-loopback destination (as the box asked for it, before REDIRECT) counts
      against ``max_connections`` (connlimit, first in nat OUTPUT; one past it is REDIRECTed to
      the gateway's cap listener, which refuses it like any refusal and audits it), and the IP
      bytes of those connections both ways (box <-> gateway socket, box <-> eb0) against one quota
      of ``max_bytes`` (``EXB-CAP``, written once: a narrowing leaves it alone). Past it every
      packet the box's namespace sends (the box's, or the gateway's towards the box) gets a
      reset; what arrives from eb0 still passes, so the box's ACK of it is what gets the reset
      and a transfer ends at once with ECONNRESET instead of stalling (as on the host's side).
      A connection cut so carries ``conntrack.LIMITED_MARK``: its record says ``limited``.
      The first packet past the quota also puts the box's address on the ``SPENT_LIST`` (xt_recent;
      the quota cannot be read without spending it): from then on a new connection is REDIRECTed
      to the gateway's spent listener, whose traffic the quota does not count, and is refused
      there and audited with its destination, instead of a reset that left no record."""
    limit = f"-m connlimit --connlimit-above {max_connections} --connlimit-mask 0"
    spent = f"-m recent --rcheck --name {SPENT_LIST} --rsource"
    nat, out = _fast(fast)
    return f"""*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:{FAST_CHAIN} - [0:0]
-A OUTPUT -p tcp ! -d 127.0.0.0/8 {spent} -j REDIRECT --to-ports {GW_SPENT_PORT}
-A OUTPUT -p tcp ! -d 127.0.0.0/8 {limit} -j REDIRECT --to-ports {GW_CAP_PORT}
-A OUTPUT -p tcp ! -d 127.0.0.0/8 -j {FAST_CHAIN}
-A OUTPUT -p tcp ! -d 127.0.0.0/8 -j REDIRECT --to-ports {GW_TCP_PORT}
-A OUTPUT -p udp ! -d 127.0.0.0/8 --dport 53 -j REDIRECT --to-ports {GW_DNS_PORT}
{nat}COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
:{FAST_CHAIN} - [0:0]
:{CAP_CHAIN} - [0:0]
:{OVER_CHAIN} - [0:0]
-A INPUT -i eb0 -m conntrack --ctstate INVALID -j DROP
-A INPUT -i eb0 -p tcp -j {CAP_CHAIN}
-A OUTPUT -p tcp -m conntrack --ctreplsrc 127.0.0.1 --ctreplsrcport {GW_SPENT_PORT} -j ACCEPT
-A OUTPUT -p tcp -m conntrack ! --ctorigdst 127.0.0.0/8 -j {CAP_CHAIN}
-A OUTPUT -d 127.0.0.0/8 -j ACCEPT
-A OUTPUT -d {box_addr}/32 -j ACCEPT
-A OUTPUT -o eb0 -m connmark --mark {ROUTED_MARK}/{ROUTED_MASK} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A OUTPUT -o eb0 -m conntrack --ctstate NEW,INVALID -j {FAST_CHAIN}
-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited
-A {CAP_CHAIN} -p tcp --tcp-flags RST RST -j RETURN
-A {CAP_CHAIN} -p tcp -m quota ! --quota {max(max_bytes, 0)} -j {OVER_CHAIN}
-A {OVER_CHAIN} -s {box_addr}/32 -m recent --set --name {SPENT_LIST} --rsource
-A {OVER_CHAIN} -d {box_addr}/32 -m recent --set --name {SPENT_LIST} --rdest
-A {OVER_CHAIN} -j CONNMARK --or-mark {conntrack.LIMITED_MARK}
-A {OVER_CHAIN} -i eb0 -j RETURN
-A {OVER_CHAIN} -p tcp -j REJECT --reject-with tcp-reset
{out}COMMIT
"""


# per-namespace conntrack settings of a routed box: byte counters for the audit; a closed
# connection's entry goes at once; a packet of no known connection never starts one (the
# loose pick-up would let the remote side re-open a connection that a narrowing deleted)
ROUTED_SYSCTLS = ("net.netfilter.nf_conntrack_acct=1", "net.netfilter.nf_conntrack_tcp_timeout_time_wait=1",
                  "net.netfilter.nf_conntrack_tcp_timeout_close=1", "net.netfilter.nf_conntrack_tcp_loose=0")
