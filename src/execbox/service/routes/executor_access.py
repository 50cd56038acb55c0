"""Who may call RAGFlow's ``/run`` when it takes no token (open mode; executor_compat.py).

Open mode (a loopback bind, ``--allow-unauthenticated`` or ``execbox serve --open-run``) is
reachable by any web page the operator's browser visits, so there ``/run`` only accepts what a
program sends and a browser cannot send cross-site without a CORS preflight (which is never
granted): ``Content-Type: application/json``, no foreign ``Origin``, and a ``Host`` on the
allow-list (loopback names, the bind address, configured names), which defeats DNS rebinding.
Kept apart from the route so the rules read (and are tested) as one piece.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from ...errors import InvalidConfigError


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Host names an open /run always answers to."""

WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
"""Bind addresses that listen on every interface: then any IP-literal Host is this server."""


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _host_name(value: str) -> str:
    """Canonical host of a ``Host`` value or ``--host`` bind: no port, no brackets, lower case,
    no trailing dot, IP literals in their compressed form."""
    value = value.strip().lower()
    if value.startswith("["):
        name = value[1:value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:  # name:port (more than one colon: a bare IPv6 address)
        name = value.split(":", 1)[0]
    else:
        name = value
    name = name.rstrip(".")
    ip = _ip(name)
    return str(ip) if ip is not None else name


@dataclass(frozen=True)
class ExecutorAuth:
    """How /run authenticates. ``open``: no token (loopback bind or explicit flag).
    ``token``: a static bearer token; otherwise tokens come from ``ExecutorDeps.store``.

    ``hosts``: the ``Host`` names an open /run answers to (DNS-rebinding guard; see the module
    docstring); ``any_ip``: also any IP-literal Host (a wildcard bind)."""

    open: bool = False
    token: str | None = None
    hosts: frozenset[str] = LOOPBACK_HOSTS
    any_ip: bool = False

    @classmethod
    def for_bind(cls, host: str, *, allow_unauthenticated: bool = False,
                 token: str | None = None, allowed_hosts: tuple[str, ...] | list[str] = ()) -> ExecutorAuth:
        bind = _host_name(host)
        extra = {_host_name(h) for h in allowed_hosts if h.strip()}
        if bind not in WILDCARD_BINDS:
            extra.add(bind)
        return cls(open=not token and (allow_unauthenticated or is_loopback(host)), token=token or None,
                   hosts=LOOPBACK_HOSTS | frozenset(extra), any_ip=bind in WILDCARD_BINDS)

    def host_allowed(self, host_header: str | None) -> bool:
        if host_header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = _host_name(host_header)
        return name in self.hosts or (self.any_ip and _ip(name) is not None)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of an origin, the scheme's default port filled in; None if malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname or parts.path not in ("", "/"):
        return None
    scheme = parts.scheme.lower()
    return scheme, _host_name(parts.hostname), port if port is not None else _DEFAULT_PORTS.get(scheme)


def _same_origin(request: Request, origin: str) -> bool:
    """Whether ``Origin`` names this request's own origin (scheme + Host). "null" (sandboxed
    frames, file:, data:) never does."""
    host = request.headers.get("host")
    ours = _origin(f"{request.url.scheme}://{host}") if host else None
    return ours is not None and _origin(origin) == ours


def open_mode_refusal(request: Request, auth: ExecutorAuth) -> InvalidConfigError | None:
    """Why an unauthenticated /run request is refused, or None: open /run answers programs, not
    web pages. A foreign page can make the browser send a "simple" cross-site POST (text/plain,
    no preflight) or, via DNS rebinding, a same-origin one to a name that resolves to us."""
    host = request.headers.get("host")
    if not auth.host_allowed(host):
        return InvalidConfigError(
            f"Host {host!r} is not allowed for the unauthenticated /run; use localhost, 127.0.0.1 or the "
            "bind address (execbox executor --allowed-host NAME adds a name)",
            details={"header": "Host"}, http_status=400)
    origin = request.headers.get("origin")
    if origin is not None and not _same_origin(request, origin):
        return InvalidConfigError(
            f"cross-origin request from {origin!r} refused: the unauthenticated /run does not serve web pages",
            details={"header": "Origin"}, http_status=403)
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        return InvalidConfigError(
            f"Content-Type must be application/json, not {ctype or 'missing'!r}",
            details={"header": "Content-Type"}, http_status=415)
    return None
