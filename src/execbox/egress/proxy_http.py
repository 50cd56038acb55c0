"""The egress proxy's HTTP side: parse a proxy request head, its credentials and target; responses.

Only what a forward proxy needs: ``CONNECT host:port`` and absolute-form ``http://`` requests
(rewritten to origin form for the upstream). Anything else is a ``BadRequest`` with a reason that
is safe to show the box. Pure functions, with the client-address helpers the proxy compares
by: unit-tested without sockets (tests/unit/test_egress_proxy.py).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_HOST = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*$")
_DROP = {"proxy-authorization", "proxy-connection", "proxy-authenticate", "connection", "keep-alive"}


class BadRequest(ValueError):
    """A request the proxy cannot serve (400), with a reason safe to show the box."""


@dataclass
class Request:
    method: str
    host: str  # lower-case hostname or IPv4 literal
    port: int
    head: bytes = b""  # what goes upstream first (plain HTTP: the rewritten head; CONNECT: nothing)
    credentials: tuple[str, str] | None = None


def parse_credentials(value: str | None) -> tuple[str, str] | None:
    """``Basic base64(user:password)`` → (user, password); anything else → None."""
    if not value:
        return None
    scheme, _, raw = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(raw.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep and user else None


def parse_target(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` → (host, port); IPv6 and anything that is not a hostname/IPv4 is refused."""
    host, sep, port_text = authority.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = authority, ""
    if host.startswith("["):
        raise BadRequest("IPv6 destinations are not supported (IPv6 is denied)")
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
            raise BadRequest(f"bad port in {authority[:100]!r}")
        port = int(port_text)
    elif default_port is not None:
        port = default_port
    else:
        raise BadRequest("CONNECT needs host:port")
    host = host.strip().lower().rstrip(".")
    if len(host) > 253 or not _HOST.fullmatch(host):
        raise BadRequest(f"{host[:100]!r} is not a hostname or IPv4 address")
    return host, port


def parse_request(head: bytes) -> Request:
    """Parse a request head (up to and including the blank line) into what the proxy needs."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes anything
        raise BadRequest("undecodable request") from e
    lines = text.split("\r\n")
    if any(c in line for line in lines for c in "\r\n\0"):  # parsers would read such a head two ways
        raise BadRequest("a bare CR, LF or NUL in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest("not an HTTP/1.0 or HTTP/1.1 request line")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("malformed header line")
        headers.append((name, value.strip()))
    auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), None)
    creds = parse_credentials(auth)
    if method == "CONNECT":
        host, port = parse_target(target, None)
        return Request(method, host, port, b"", creds)
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc:
        raise BadRequest("only CONNECT and absolute-form http:// requests are proxied")
    if "@" in url.netloc:
        raise BadRequest("user info in the URL is not allowed")
    host, port = parse_target(url.netloc, 80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    # RFC 9112 3.2.2: a proxy replaces any received Host with the request-target's authority, so
    # the upstream sees the host the policy decided on, not another one sharing its address.
    out = [f"{method} {path} {version}", f"Host: {url.netloc}"]
    out += [f"{k}: {v}" for k, v in headers if k.lower() not in _DROP and k.lower() != "host"]
    out.append("Connection: close")
    return Request(method, host, port, ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), creds)


def response(status: str, reason: str, extra: str = "") -> bytes:
    body = f"execbox egress {'denied' if status.startswith('403') else 'proxy'}: {reason}\n".encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{extra}Connection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def peer_of(transport: Any) -> str:
    """The client address of a transport, as text ("?" when unknown)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


def client_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A client or pod address, comparable: an IPv6 scope dropped, an IPv4-mapped IPv6 address as IPv4."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as an IPv4 address when it is one (a request naming an address, not a name)."""
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return None
