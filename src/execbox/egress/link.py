"""One box's attachment to the gateway (``BoxLink``): its policy, caps, synthetic names, audit
budgets, and the connections a narrowing must reach.

Split from gateway.py, which keeps the connection path. A narrowing (``set_policy``) reaches
every connection of the box the new policy no longer allows: relayed ones (``relays``, see
relay.py) and those still being decided or dialled (``pending``): those wait seconds on a lookup
or an upstream connect, during which they are in no relay yet.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..settings import env_int
from . import audit, relay
from .conntrack import ConntrackAudit
from .policy import EgressPolicy

log = logging.getLogger("execbox.egress")

SYNTH_NET = ipaddress.ip_network("198.19.0.0/16")
NARROWED_PENDING = "refused: the network policy was narrowed while this connection was being decided"


@dataclass
class Limits:
    max_connections: int = 64  # concurrent TCP connections per box
    max_bytes: int = 1024 ** 3  # bytes up + down per box over its life

    @classmethod
    def from_env(cls) -> Limits:
        """The caps from EXECBOX_EGRESS_MAX_CONNECTIONS / _MAX_BYTES; a value that is not a whole
        number >= 1 is SB002 naming it (it once fell back to the default without a word)."""
        return cls(env_int("EXECBOX_EGRESS_MAX_CONNECTIONS", cls.max_connections, 1),
                   env_int("EXECBOX_EGRESS_MAX_BYTES", cls.max_bytes, 1))


class Pending:
    """A connection between its accept and its relay (deciding, resolving, dialling, a TLS
    handshake): ``abort`` resets the box's side and cancels its handler wherever it waits, so
    nothing it was about to send upstream is sent."""

    def __init__(self, rec: audit.AuditRecord, task: asyncio.Task | None, transport: asyncio.BaseTransport) -> None:
        self.rec, self.task, self.transport = rec, task, transport
        self.cut = False

    def allowed(self, policy: EgressPolicy) -> bool:
        """A name not resolved yet is judged by the name; once its address is known, as an open
        connection is (relay.still_allowed)."""
        if self.rec.ip is None:
            return self.rec.host is not None and policy.name_allowed(self.rec.host, self.rec.port)
        return relay.still_allowed(policy, self.rec)

    def abort(self) -> None:
        self.cut = True
        self.transport.abort()
        if self.task is not None:
            self.task.cancel()


class BoxLink:
    """One box's attachment to the gateway: its policy, synthetic names, counters and sockets."""

    def __init__(self, box: str, policy: EgressPolicy, limits: Limits, tcp: Any, udp: Any) -> None:
        self.box = box
        self.policy = policy
        self.limits = limits
        self.tenant_id: str | None = None
        self.session_id: str | None = None
        self.run_id: str | None = None
        self.active = 0
        self.lookup_slots: asyncio.Semaphore | None = None  # its share of the resolver (resolver.py)
        self.bytes_total = 0
        self._names: dict[str, ipaddress.IPv4Address] = {}
        self._addrs: dict[ipaddress.IPv4Address, str] = {}
        self._tcp = tcp
        self._udp = udp
        self._server: asyncio.base_events.Server | None = None
        self._capped: Any = None  # a routed box's listener for connections past its cap
        self._capped_server: asyncio.base_events.Server | None = None
        self._spent: Any = None  # ... and for those after its byte quota is spent
        self._spent_server: asyncio.base_events.Server | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.relays: set[Any] = set()  # relayed connections (egress/relay.py), aborted on detach or narrowing
        self.pending: set[Pending] = set()  # connections not relayed yet, cut by a narrowing too
        self.intercept: Any = None  # credential injection (egress/inject.py), set when the policy needs it
        self.on_policy: Any = None  # the kernel route's re-pointing (boxes/jail_net.py), when the box has one
        self.conntrack: ConntrackAudit | None = None
        self.dns_denials = audit.RowBudget()
        self.tcp_refusals = audit.RowBudget()
        self.connections = audit.ConnectionRows(self.record)  # rows of connections not refused

    def set_policy(self, policy: EgressPolicy) -> None:
        """Replace the policy; connections opened from now on (and DNS answers) follow it, and
        open ones it no longer allows are cut.

        A kernel-routed box also gets its routed destinations re-pointed; if that fails the route
        is shut (no routed destination at all, the gateway still serves the rest) and the error
        is raised, so a narrowing is never reported done while the wider rules still stand."""
        if self.on_policy is not None and policy != self.policy:
            try:
                self.on_policy(policy)
            except Exception:
                try:
                    self.on_policy(EgressPolicy())
                except Exception:  # noqa: BLE001
                    log.exception("egress: cannot shut the kernel route of %s", self.box)
                self.policy = policy
                self._cut_unlisted()
                raise
        self.policy = policy
        self._cut_unlisted()

    def _cut_unlisted(self) -> None:
        """End the box's connections the policy no longer allows, open or still being decided,
        before returning (a narrowing is done when it returns, for open connections as for new
        ones). The policy is set before this runs, so a connection that joins ``pending`` after
        the check below decides under the new one."""
        if not self.relays and not self.pending:
            return
        from .gateway import gateway

        gw = gateway()

        async def cut() -> None:
            self.cut_now()

        if threading.get_ident() == gw._thread.ident:
            self.cut_now()
        else:
            gw._run(cut())

    def cut_now(self) -> None:
        """On the gateway's loop: relayed connections first; a pending one whose relay has begun
        (its record is a relay's) is left to that relay."""
        relay.cut_unlisted(self.relays, self.policy)
        relayed = {id(r.rec) for r in self.relays}
        for p in list(self.pending):
            if id(p.rec) not in relayed and not p.allowed(self.policy):
                p.abort()

    def synth(self, name: str) -> ipaddress.IPv4Address:
        ip = self._names.get(name)
        if ip is None:
            if len(self._names) >= SYNTH_NET.num_addresses - 2:
                self._names.clear()
                self._addrs.clear()
            ip = SYNTH_NET[len(self._names) + 1]
            self._names[name] = ip
            self._addrs[ip] = name
        return ip

    def name_of(self, ip: ipaddress.IPv4Address) -> str | None:
        return self._addrs.get(ip)

    def summarize_dns_denials(self, n: int) -> None:
        """One row for ``n`` refused DNS names that got none of their own (audit.RowBudget)."""
        self._summarize("dns", n, "names not allowed by the network policy")

    def summarize_tcp_refusals(self, n: int) -> None:
        """The same for refused connections: a box can open them to a denied address (or, past a
        cap, to anything) as fast as its loopback allows."""
        self._summarize("tcp", n, "connections refused")

    def _summarize(self, kind: str, n: int, what: str) -> None:
        if n:
            audit.record(self.record(kind=kind, host=None, ip=None, port=None, decision="denied",
                                     reason=f"{n} more {what} within one second "
                                            "(over 20 a second: counted, not recorded one by one)"), counted=False)

    def record(self, **kw: Any) -> audit.AuditRecord:
        return audit.AuditRecord(box=self.box, tenant_id=self.tenant_id, session_id=self.session_id,
                                 run_id=self.run_id, **kw)
