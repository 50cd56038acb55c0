"""The HTTP of an intercepted connection (``inject.Injector``): one request out, the secret kept in.

Three rules, each closing a way for the secret to leave the credentialed host or reach the box:

- ``rewrite_head``: the one head the secret goes with names that host and parses one way only.
- ``RequestBody``: exactly one request reaches the upstream, its head and the body that head
  declares. Anything after it (a pipelined or keep-alive second request, the tail of a
  smuggling attempt) never went through ``rewrite_head``, and an upstream that ignores
  ``Connection: close`` would read it as a request of its own, with the box's Host and
  ``X-Forwarded-*``: the box's connection is ended instead.
- ``Scrubber``: a host that reflects request headers (an echo or debug endpoint, an error
  message) would show the secret to the box; every occurrence in the response becomes ``*``s
  of the same length (so Content-Length and chunk sizes stay right), across chunk boundaries.
  The request asks for an uncompressed response (``Accept-Encoding: identity``) so the secret
  is there to be seen. What the scrubber cannot see (a transformed or compressed copy) is
  listed in docs/network.md.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: a method or header name

_NOT_FORWARDED = {b"connection", b"proxy-connection", b"keep-alive", b"host", b"forwarded", b"x-forwarded-host",
                  b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-port", b"x-forwarded-server",
                  b"x-original-url", b"x-rewrite-url", b"x-original-host", b"x-host"}
"""Headers a front end may route by besides Host: the box's would pick the site that gets the secret."""

_REPLACED = {b"accept-encoding", b"te"}
"""The box's compression asks: a compressed response would hide a reflected secret from ``Scrubber``."""

SECOND_REQUEST = "ended: bytes after the first request (one request per intercepted connection)"
MIN_SCRUBBED = 8
"""Shorter values are not scrubbed: they would match ordinary response bytes (and are no real secret)."""


class HeadRefused(ValueError):
    """A request head the injector will not add a secret to (the reason goes to the box and the audit)."""


def rewrite_head(head: bytes, name: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """Request head for ``name`` with the secret headers set (replacing the box's own), ``Host: name``,
    ``Accept-Encoding: identity`` and ``Connection: close``.

    The TLS connection goes to ``name``, but a shared front end (a CDN, virtual hosting) routes by
    the Host header and an absolute-form target: a secret sent with another host there would reach
    that other site. So the target must be origin-form (or name this host), every Host the box sent
    is replaced by this one, and heads that parsers could read differently (a bare CR or LF, a
    folded line, a line that is not ``name: value``, a version other than 1.0 and 1.1) are refused.
    """
    from urllib.parse import urlsplit

    lines = head.split(b"\r\n")
    if any(b"\n" in ln or b"\r" in ln or b"\0" in ln for ln in lines):
        raise HeadRefused("a bare CR, LF or NUL in the request head")
    if any(ln[:1] in (b" ", b"\t") for ln in lines[1:]):
        raise HeadRefused("a folded header line in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.0", b"HTTP/1.1") or not _TOKEN.fullmatch(parts[0]):
        raise HeadRefused("not an HTTP/1.0 or HTTP/1.1 request line")
    method, target, version = parts
    if method.upper() in (b"TRACE", b"TRACK", b"CONNECT"):  # TRACE echoes the request, secret included
        raise HeadRefused(f"method {method.decode('latin-1')[:10]} is not sent with credentials")
    if any(c <= 0x20 or c >= 0x7F for c in target):
        raise HeadRefused("a control character, space or non-ASCII byte in the request target")
    if not (target.startswith(b"/") or (target == b"*" and method == b"OPTIONS")):
        url = urlsplit(target.decode("latin-1"))
        try:
            port = url.port
        except ValueError:
            port = -1
        if url.scheme.lower() != "https" or (url.hostname or "").rstrip(".") != name or port not in (None, 443) \
                or url.username is not None:
            raise HeadRefused(f"the request target names another host than {name}")
        target = ((url.path or "/") + (f"?{url.query}" if url.query else "")).encode("latin-1")
    drop = {k.lower().encode() for k, _ in headers} | _NOT_FORWARDED | _REPLACED
    kept = [b" ".join((method, target, version)), f"Host: {name}".encode()]
    for ln in lines[1:]:
        field, colon, _ = ln.partition(b":")
        if not colon or not _TOKEN.fullmatch(field):  # "Host evil.example", "Host : x": read two ways
            raise HeadRefused("a header line that is not 'name: value'")
        if field.lower() not in drop:
            kept.append(ln)
    kept += [f"{k}: {v}".encode() for k, v in headers] + [b"Accept-Encoding: identity", b"Connection: close"]
    return b"\r\n".join(kept) + b"\r\n\r\n"


def request_body(head: bytes) -> RequestBody:
    """How the body after ``head`` (one ``rewrite_head`` accepted) ends. A head two parsers could
    frame differently (both Content-Length and Transfer-Encoding, two lengths, a coding other than
    chunked) is refused: the upstream must see the request end where the gateway does."""
    lengths, codings = [], []
    for ln in head.split(b"\r\n")[1:]:
        field, _, value = ln.partition(b":")
        field, value = field.lower(), value.strip(b" \t")
        if field == b"content-length":
            lengths.append(value)
        elif field == b"transfer-encoding":
            codings.append(value.lower())
    if codings:
        if lengths:
            raise HeadRefused("both Content-Length and Transfer-Encoding")
        if codings != [b"chunked"]:
            raise HeadRefused("a Transfer-Encoding other than chunked")
        return RequestBody(chunked=True)
    if len(lengths) > 1:
        raise HeadRefused("more than one Content-Length")
    if lengths and not re.fullmatch(rb"[0-9]{1,15}", lengths[0]):
        raise HeadRefused("a Content-Length that is not a number")
    return RequestBody(int(lengths[0]) if lengths else 0)


class RequestBody:
    """The box->upstream bytes after the head: passes the declared body and ends the connection
    at any byte past it (``feed`` raises). A chunked body is parsed strictly (sizes in hex with no
    extension, CRLF after each chunk, no trailers); anything else ends the connection too."""

    MAX_LINE = 64

    def __init__(self, length: int = 0, chunked: bool = False) -> None:
        self.chunked = chunked
        self.left = 0 if chunked else length  # bytes of the body (chunked: of this chunk's data) still to come
        self.state = "size"  # chunked, the line expected next: a "size", the "crlf" after its data, the "last"
        self.line = b""
        self.done = not chunked and length == 0

    def feed(self, data: bytes) -> bytes:
        if not self.chunked:
            if len(data) > self.left:
                raise ValueError(SECOND_REQUEST)
            self.left -= len(data)
            self.done = not self.left
            return data
        i = 0
        while i < len(data):
            if self.done:
                raise ValueError(SECOND_REQUEST)
            if self.left:  # chunk data: passed as it is
                n = min(self.left, len(data) - i)
                i += n
                self.left -= n
                continue
            j = data.find(b"\n", i)
            end = len(data) if j < 0 else j + 1
            self.line += data[i:end]
            i = end
            if len(self.line) > self.MAX_LINE:
                raise ValueError("ended: a chunk line of the request body is too long")
            if j >= 0:
                line, self.line = self.line, b""
                self._line(line)
        return data

    def _line(self, line: bytes) -> None:
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            raise ValueError("ended: a chunk line of the request body does not end in CRLF")
        line = line[:-2]
        if self.state == "size":
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,12}", line):
                raise ValueError("ended: a chunk size of the request body is not plain hex")
            self.left = int(line, 16)
            self.state = "crlf" if self.left else "last"
        elif line:
            raise ValueError("ended: request trailers (or bytes after a chunk) are not forwarded")
        elif self.state == "crlf":
            self.state = "size"
        else:
            self.done = True

    def end(self) -> bytes:
        return b""


def secret_values(headers: tuple[tuple[str, str], ...]) -> list[bytes]:
    """What of the injected headers must not reach the box: each value, and the credential of a
    ``Scheme credential`` value (``Bearer sk-...``: an error message may quote the key alone)."""
    out = []
    for _, v in headers:
        out.append(v.encode())
        scheme, sp, cred = v.partition(" ")
        if sp and re.fullmatch(r"[A-Za-z][A-Za-z0-9._~+-]*", scheme) and cred.strip():
            out.append(cred.strip().encode())
    return out


class Scrubber:
    """The upstream->box bytes: each secret becomes ``*``s of its length. Bytes that could be the
    start of a secret finishing in the next chunk are held back (at most the longest secret less
    one byte), and only those: a streamed response (server-sent events) is not delayed."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SCRUBBED}, key=len, reverse=True)
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        if not self.secrets:
            return data
        buf = self.held + data
        for s in self.secrets:
            if s in buf:
                buf = buf.replace(s, b"*" * len(s))
        keep = 0
        for k in range(min(len(buf), len(self.secrets[0]) - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.secrets):
                keep = k
                break
        self.held = buf[len(buf) - keep:] if keep else b""
        return buf[:len(buf) - keep]

    def end(self) -> bytes:
        held, self.held = self.held, b""
        return held
