"""Egress policy: ``none`` | ``allowlist`` | ``open`` plus allow entries, validated in one place.

An allow entry is a string ``HOST[:PORTS]`` (PORTS = ``443`` or ``80|443|8443``; default 80 and
443) or a dict ``{"host": ..., "ports": [...]}``. HOST is an exact hostname, a ``*.suffix``
wildcard, an IPv4 address or an IPv4 CIDR. Anything else (a URL, a bare ``*``, a bad CIDR, a
port out of range, IPv6) is refused with SB002 naming the entry: nothing is half-applied.

Special ranges (loopback, link-local incl. the metadata IP, RFC 1918, CGNAT, multicast, the
host's own addresses, the gateway's internal ranges) are never reachable through a hostname
entry or ``open``: only an IP/CIDR entry lying inside such a range unlocks (that part of) it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidConfigError, SandboxError

MODES = ("none", "allowlist", "open")
DEFAULT_PORTS = (80, 443)
MAX_ENTRIES = 1024
"""Allow entries in one policy at most: every DNS answer and connect of the box is checked against
all of them on the gateway's one thread, which serves every box."""
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")  # fullmatch: "$" would let a trailing newline in
_PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit() also takes "²" and "４"

ALWAYS_DENIED = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "100.64.0.0/10", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
))
"""IPv4 ranges no hostname entry and no ``open`` policy reaches (198.18/15 holds the gateway's own
box-side addresses). IPv6 (incl. ::1, fe80::/10, fc00::/7) is not routed out of a box at all."""


class EgressDenied(SandboxError):
    """A session asked for more network than its provider or tenant allows (403)."""

    code = "SB002"
    http_status = 403
    resolution = "Ask for a narrower network policy, or have an admin raise the cap."


@dataclass(frozen=True)
class AllowEntry:
    host: str  # lower-case hostname, "*.suffix", or "" for an IP entry
    network: ipaddress.IPv4Network | None
    ports: tuple[int, ...] = DEFAULT_PORTS
    headers: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # credential injection
    # an exact /32 may reach an address of the host only when an operator listed it so: a session's
    # /32 of a public address must not start reaching the host when the host later takes that address
    reaches_host: bool = field(default=True, compare=False)

    @property
    def is_ip(self) -> bool:
        return self.network is not None

    @property
    def unlocks_denied(self) -> bool:
        """Does this entry open (part of) an always-denied range or an address of the host? Only an
        operator's entry may: ``open`` does not reach those, so a narrowing under it must not either."""
        if self.network is None:
            return False
        if any(self.network.subnet_of(n) for n in ALWAYS_DENIED):
            return True
        return self.network.prefixlen == 32 and is_host_address(self.network.network_address)

    def matches_name(self, name: str, port: int) -> bool:
        if self.is_ip or port not in self.ports:
            return False
        if self.host.startswith("*."):
            return name.endswith(self.host[1:]) and len(name) > len(self.host) - 1
        return name == self.host

    def matches_ip(self, ip: ipaddress.IPv4Address, port: int) -> bool:
        return self.network is not None and port in self.ports and ip in self.network

    def text(self) -> str:
        target = str(self.network) if self.network is not None else self.host
        return f"{target}:{'|'.join(map(str, self.ports))}"

    def covers(self, other: AllowEntry) -> bool:
        """True when everything ``other`` allows is allowed by this entry. An entry that opens an
        always-denied range is covered only by one that opens it too: ``8.0.0.0/5`` does not reach
        10.0.0.0/8, so it does not cover ``10.1.0.0/16``."""
        if not set(other.ports) <= set(self.ports):
            return False
        if self.network is not None:
            return (other.network is not None and other.network.subnet_of(self.network)
                    and (self.unlocks_denied or not other.unlocks_denied))
        if other.network is not None:
            return False
        if self.host.startswith("*."):
            return other.host.endswith(self.host[1:])
        return other.host == self.host


@dataclass(frozen=True)
class EgressPolicy:
    mode: str = "none"
    allow: tuple[AllowEntry, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.mode, "allow": [e.text() for e in self.allow]}

    def name_allowed(self, name: str, port: int | None = None) -> bool:
        if self.mode == "open":
            return True
        if self.mode != "allowlist":
            return False
        return any(e.matches_name(name, p) for e in self.allow for p in ((port,) if port else e.ports))

    def ip_allowed(self, ip: ipaddress.IPv4Address, port: int, via_name: bool = False) -> tuple[bool, str]:
        """May a connection go to ``ip:port``? ``via_name``: the box reached it through an allowed name."""
        if self.mode == "none":
            return False, "network is none"
        special = next((n for n in ALWAYS_DENIED if ip in n), None)
        explicit = [e for e in self.allow if e.matches_ip(ip, port)]
        if special is not None or is_host_address(ip):
            if any(e.network is not None and e.network.subnet_of(special or e.network) and
                   (special is not None or (e.network.prefixlen == 32 and e.reaches_host)) for e in explicit):
                return True, "explicit cidr"
            return False, f"{ip} is in an always-denied range ({special or 'address of the host'})"
        if self.mode == "open" or via_name or explicit:
            return True, "allowed"
        return False, f"{ip}:{port} is not in the allow list"

    def narrow(self, requested: EgressPolicy) -> EgressPolicy:
        """The requested policy if it is within this one, else EgressDenied naming what is wider."""
        rank = {m: i for i, m in enumerate(MODES)}
        if rank[requested.mode] > rank[self.mode]:
            raise EgressDenied(f"network {requested.mode!r} is wider than the allowed {self.mode!r}",
                               details={"requested": requested.mode, "cap": self.mode})
        if requested.mode == "allowlist" and self.mode == "allowlist":
            for e in requested.allow:
                if not any(c.covers(e) for c in self.allow):
                    raise EgressDenied(f"allow entry {e.text()!r} is not within the allowed policy",
                                       details={"entry": e.text(), "cap": self.to_dict()})
        if requested.mode == "allowlist" and self.mode == "open":
            for e in requested.allow:
                if e.unlocks_denied:
                    raise EgressDenied(f"allow entry {e.text()!r} is in an always-denied range or names an address "
                                       "of the host, which the allowed policy 'open' does not reach",
                                       details={"entry": e.text(), "cap": self.to_dict()})
        if requested.mode == "allowlist":
            # injected credentials come only from the operator's cap, never from a session
            out = []
            for e in requested.allow:
                src = next((c for c in self.allow if c.headers and not e.is_ip and c.host == e.host), None)
                out.append(AllowEntry(e.host, e.network, e.ports, src.headers if src else (),
                                      reaches_host=self._reaches_host(e)))
            return EgressPolicy("allowlist", tuple(out))
        return requested

    def intersect(self, other: EgressPolicy) -> EgressPolicy:
        """What both allow (a provider policy and a tenant cap; a session's and a run's); this
        policy's credentials are kept. ``open`` reaches public addresses only, on either side, so
        an entry that opens an always-denied range survives only where both sides open it."""
        if "none" in (self.mode, other.mode):
            return EgressPolicy()
        if self.mode == "open" and other.mode == "open":
            return self
        if self.mode == "open":  # other's entries, less any that would open what ``open`` denies
            kept = [AllowEntry(e.host, e.network, e.ports, reaches_host=False) for e in other.allow
                    if not e.unlocks_denied]
        elif other.mode == "open":
            kept = [AllowEntry(e.host, e.network, e.ports, e.headers, reaches_host=False) for e in self.allow
                    if not e.unlocks_denied]
        else:
            mine = [AllowEntry(e.host, e.network, e.ports, e.headers, reaches_host=other._reaches_host(e))
                    for e in self.allow if any(o.covers(e) for o in other.allow)]
            kept = mine + [AllowEntry(o.host, o.network, o.ports, self._headers_for(o),
                                      reaches_host=self._reaches_host(o)) for o in other.allow
                           if any(e.covers(o) for e in self.allow) and not any(m.covers(o) for m in mine)]
        return EgressPolicy("allowlist", tuple(kept)) if kept else EgressPolicy()

    def _reaches_host(self, entry: AllowEntry) -> bool:
        """May ``entry`` (an exact /32 within this policy) reach an address of the host? Only where
        this policy has the same /32 allowed to (``open`` reaches no address of the host)."""
        return (self.mode == "allowlist" and entry.network is not None and entry.network.prefixlen == 32
                and any(c.network == entry.network and c.reaches_host for c in self.allow))

    def _headers_for(self, entry: AllowEntry) -> tuple[tuple[str, str], ...]:
        """The credentials of this policy's exact-host entry that covers ``entry`` (a narrower one
        for the same host keeps them: ``api.example.com:443`` under ``api.example.com:80|443``)."""
        if entry.is_ip:
            return ()
        src = next((c for c in self.allow if c.headers and c.host == entry.host and c.covers(entry)), None)
        return src.headers if src else ()

    def credentials_for(self, name: str, port: int) -> tuple[tuple[str, str], ...]:
        for e in self.allow:
            if e.headers and e.matches_name(name, port):
                return e.headers
        return ()


def _bad(entry: Any, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"network allow entry {entry!r}: {why}",
                              details={"field": "network_allow", "entry": str(entry)[:200], "reason": why})


def _ports(entry: Any, raw: Any) -> tuple[int, ...]:
    items = raw.split("|") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise _bad(entry, "ports must be a non-empty list")
    out: list[int] = []
    for p in items:
        if isinstance(p, str) and _PORT.fullmatch(p.strip()):
            p = int(p.strip())
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise _bad(entry, f"port {p!r} is not in 1..65535")
        out.append(p)
    return tuple(sorted(set(out)))


def _host(entry: Any, host: str) -> tuple[str, ipaddress.IPv4Network | None]:
    host = host.strip().lower().rstrip(".")
    if not host:
        raise _bad(entry, "empty host")
    if "/" in host or re.fullmatch(r"[0-9.]+", host):
        try:
            net = ipaddress.ip_network(host, strict=True)
        except ValueError as e:
            raise _bad(entry, f"not a valid IPv4 address or CIDR ({e})") from None
        if not isinstance(net, ipaddress.IPv4Network):
            raise _bad(entry, "IPv6 destinations are not supported (IPv6 is denied)")
        if net.prefixlen == 0:
            raise _bad(entry, "0.0.0.0/0 is not an allow entry; use network=open")
        return "", net
    if ":" in host or "[" in host:
        raise _bad(entry, "IPv6 destinations are not supported (IPv6 is denied)")
    if host == "*" or host.startswith("*") and not host.startswith("*."):
        raise _bad(entry, "a wildcard must be '*.suffix' with a real suffix; bare '*' is network=open")
    name = host[2:] if host.startswith("*.") else host
    labels = name.split(".")
    if (len(name) > 253 or not all(_LABEL.fullmatch(lab) for lab in labels)
            or (host.startswith("*.") and len(labels) < 2)):
        raise _bad(entry, "not a hostname (letters, digits, '-' and '.'; no scheme, path or user)")
    return host, None


def parse_entry(entry: Any) -> AllowEntry:
    headers: tuple[tuple[str, str], ...] = ()
    if isinstance(entry, dict):
        unknown = set(entry) - {"host", "ports", "headers"}
        if unknown:
            raise _bad({k: v for k, v in entry.items() if k != "headers"}, f"unknown keys {sorted(unknown)}")
        raw_host = entry.get("host")
        shown = {k: v for k, v in entry.items() if k != "headers"}  # errors never carry a header value
        if not isinstance(raw_host, str):
            raise _bad(shown, "host must be a string")
        ports = _ports(shown, entry["ports"]) if entry.get("ports") is not None else DEFAULT_PORTS
        hdrs = entry.get("headers") or {}
        if not isinstance(hdrs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hdrs.items()):
            raise _bad(shown, "headers must map header names to strings")
        for k, v in hdrs.items():
            if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", k) or any(c in v for c in "\r\n\0"):
                raise _bad(shown, f"header {k[:64]!r} is not a valid header")
        headers = tuple(sorted(hdrs.items()))
        host, net = _host(shown, raw_host)
        entry = shown
    elif isinstance(entry, str):
        if "://" in entry or "/" in entry.split(":")[0] and not re.fullmatch(r"[0-9./:|]+", entry):
            raise _bad(entry, "a URL is not an allow entry; give HOST[:PORTS]")
        target, sep, raw_ports = entry.strip().partition(":")
        host, net = _host(entry, target)
        ports = _ports(entry, raw_ports) if sep else DEFAULT_PORTS
    else:
        raise _bad(entry, "must be a string HOST[:PORTS] or an object {host, ports}")
    if headers and net is not None:
        raise _bad(entry, "credential headers need a hostname entry")
    if headers and host.startswith("*."):
        raise _bad(entry, "credential headers need an exact hostname, not a wildcard")
    return AllowEntry(host, net, ports, headers)


def parse_policy(mode: Any, allow: Any = None) -> EgressPolicy:
    """Validate a whole policy; raises SB002 naming the first bad field or entry."""
    mode = "none" if mode in (None, "") else mode
    if mode not in MODES:
        raise InvalidConfigError(f"network must be one of {', '.join(MODES)}, not {mode!r}",
                                 details={"field": "network", "value": str(mode)[:50]})
    if allow in (None, ""):
        allow = []
    if isinstance(allow, str):
        allow = [a for a in allow.split(",") if a.strip()]
    if not isinstance(allow, (list, tuple)):
        raise InvalidConfigError("network_allow must be a list", details={"field": "network_allow"})
    if len(allow) > MAX_ENTRIES:
        raise InvalidConfigError(f"network_allow has {len(allow)} entries; at most {MAX_ENTRIES} are allowed "
                                 "(use CIDRs or *.suffix wildcards to cover more)",
                                 details={"field": "network_allow", "entries": len(allow), "max": MAX_ENTRIES})
    entries = tuple(parse_entry(e) for e in allow)
    if mode != "allowlist" and entries:
        raise InvalidConfigError(f"network_allow entries need network=allowlist (network is {mode!r})",
                                 details={"field": "network_allow", "network": mode})
    return EgressPolicy(mode, entries)


_host_addrs: tuple[float, frozenset[ipaddress.IPv4Address]] = (0.0, frozenset())
_nonlocal_bind: bool | None = None


def is_host_address(ip: ipaddress.IPv4Address) -> bool:
    """Is ``ip`` an address of this host now? The 5-s table, then the kernel itself: binding a
    socket to an address succeeds only for a local one, so an address added since the table was
    read (a new bridge, a container network) is denied at once, not up to 5 s later."""
    global _nonlocal_bind
    if ip in host_addresses():
        return True
    if _nonlocal_bind is None:
        try:
            with open("/proc/sys/net/ipv4/ip_nonlocal_bind", encoding="ascii") as f:
                _nonlocal_bind = f.read().strip() != "0"
        except OSError:
            _nonlocal_bind = False
    if _nonlocal_bind:  # any bind succeeds there: only the table can tell
        return False
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError:
            return False
    return True


def host_addresses() -> frozenset[ipaddress.IPv4Address]:
    """Every IPv4 address of this host (refreshed every 5 s): never a destination, whatever the policy."""
    global _host_addrs
    import socket
    import time

    ts, addrs = _host_addrs
    if time.monotonic() - ts < 5.0:
        return addrs
    found: set[ipaddress.IPv4Address] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as f:
            prev = ""
            for line in f:
                if "/32 host LOCAL" in line:
                    found.add(ipaddress.IPv4Address(prev.split()[-1]))
                prev = line
    except (OSError, ValueError):
        try:
            found.add(ipaddress.IPv4Address(socket.gethostbyname(socket.gethostname())))
        except (OSError, ValueError):
            pass
    _host_addrs = (time.monotonic(), frozenset(found))
    return _host_addrs[1]


def with_credentials(policy: EgressPolicy, raw: Any) -> EgressPolicy:
    """Attach injected headers (provider secret ``network_credentials``) to exact-host allow entries.

    ``raw`` is JSON text or a dict ``{host: {header: value}}``; every host must be an exact hostname
    already in the allow list. Errors name the host, never the value.
    """
    import json

    if raw in (None, "", {}):
        return policy
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise InvalidConfigError("network_credentials must be a JSON object {host: {header: value}}",
                                     details={"field": "network_credentials"}) from None
    if not isinstance(raw, dict):
        raise InvalidConfigError("network_credentials must be a JSON object {host: {header: value}}",
                                 details={"field": "network_credentials"})
    entries = list(policy.allow)
    for host, headers in raw.items():
        parsed = parse_entry({"host": host, "headers": headers}) if isinstance(host, str) else None
        idx = next((i for i, e in enumerate(entries) if parsed and not e.is_ip and e.host == parsed.host), None)
        if parsed is None or idx is None:
            raise InvalidConfigError(f"network_credentials: host {str(host)[:100]!r} is not an exact host in "
                                     "network_allow", details={"field": "network_credentials", "host": str(host)[:100]})
        e = entries[idx]
        entries[idx] = AllowEntry(e.host, None, e.ports, parsed.headers)
    return EgressPolicy(policy.mode, tuple(entries))


def has_credentials(policy: EgressPolicy | None) -> bool:
    return policy is not None and any(e.headers for e in policy.allow)
