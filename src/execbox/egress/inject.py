"""Credential injection: the gateway adds secret headers for one host; the box never sees them.

Only connections to a host whose allow entry carries headers are intercepted, and only on port
443: the gateway terminates the box's TLS with a leaf certificate for that host, signed by a CA
made for this box alone (``BoxCA``; the box trusts it through a CA bundle mounted at the usual
paths), opens its own verified TLS connection upstream, reads the request head, drops any
header of the same name the box sent (a placeholder such as ``Authorization: Bearer x``),
adds the secret ones, sets ``Host`` to that host (``rewrite_head``) and forces
``Connection: close`` (one request per intercepted connection, so every request head passes
through here). The rest is spliced. Plain HTTP never carries an
injected secret. TLS and X.509 are the ``ssl`` module and ``cryptography``; nothing hand-made.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl
import tempfile
from typing import Any

from . import audit
from .relay import relay_streams

HOST_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
MAX_HEAD = 64 * 1024
BOX_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BOX_ENV = {"SSL_CERT_FILE": BOX_BUNDLE, "NODE_EXTRA_CA_CERTS": BOX_BUNDLE, "REQUESTS_CA_BUNDLE": BOX_BUNDLE,
           "CURL_CA_BUNDLE": BOX_BUNDLE}
"""Environment of a box whose policy injects credentials: every common client trusts the bundle."""


class BoxCA:
    """A throwaway CA for one box (EC P-256, valid one day); its key never leaves the gateway."""

    def __init__(self, box: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._ser, self._ec, self._oid = x509, hashes, serialization, ec, NameOID
        now = datetime.datetime.now(datetime.UTC)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"execbox egress CA {box}"[:64])])
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                    critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self._leaf: dict[str, ssl.SSLContext] = {}
        self.dir = tempfile.mkdtemp(prefix="exb-ca-")
        os.chmod(self.dir, 0o755)
        self.bundle = os.path.join(self.dir, "ca-certificates.crt")
        host = b""
        for path in HOST_BUNDLES:
            try:
                with open(path, "rb") as f:
                    host = f.read()
                break
            except OSError:
                continue
        with open(self.bundle, "wb") as f:
            f.write(host + b"\n" + self.pem)
        os.chmod(self.bundle, 0o644)

    def server_context(self, host: str) -> ssl.SSLContext:
        ctx = self._leaf.get(host)
        if ctx is not None:
            return ctx
        x509, ser = self._x509, self._ser
        now = datetime.datetime.now(datetime.UTC)
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(self._oid.COMMON_NAME, host[:64])]))
                .issuer_name(self.name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
                .sign(self.key, self._hashes.SHA256()))
        path = os.path.join(self.dir, f"leaf-{len(self._leaf)}.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
            f.write(cert.public_bytes(ser.Encoding.PEM) + self.pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        ctx.load_cert_chain(path)
        os.unlink(path)
        self._leaf[host] = ctx
        return ctx

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def upstream_context() -> ssl.SSLContext:
    """Verified TLS to the real host (system trust, plus EXECBOX_EGRESS_UPSTREAM_CA if set)."""
    ctx = ssl.create_default_context()
    extra = os.environ.get("EXECBOX_EGRESS_UPSTREAM_CA", "").strip()
    if extra:
        ctx.load_verify_locations(cafile=extra)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


_NOT_FORWARDED = {b"connection", b"proxy-connection", b"keep-alive", b"host", b"forwarded", b"x-forwarded-host",
                  b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-port", b"x-forwarded-server",
                  b"x-original-url", b"x-rewrite-url", b"x-original-host", b"x-host"}
"""Headers a front end may route by besides Host: the box's would pick the site that gets the secret."""


class HeadRefused(ValueError):
    """A request head the injector will not add a secret to (the reason goes to the box and the audit)."""


def rewrite_head(head: bytes, name: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """Request head for ``name`` with the secret headers set (replacing the box's own), ``Host: name``
    and Connection: close.

    The TLS connection goes to ``name``, but a shared front end (a CDN, virtual hosting) routes by
    the Host header and an absolute-form target: a secret sent with another host there would reach
    that other site. So the target must be origin-form (or name this host), every Host the box sent
    is replaced by this one, and heads that parsers could read differently (a bare CR or LF, a
    folded line) are refused.
    """
    from urllib.parse import urlsplit

    lines = head.split(b"\r\n")
    if any(b"\n" in ln or b"\r" in ln or b"\0" in ln for ln in lines):
        raise HeadRefused("a bare CR, LF or NUL in the request head")
    if any(ln[:1] in (b" ", b"\t") for ln in lines[1:]):
        raise HeadRefused("a folded header line in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise HeadRefused("not an HTTP/1.x request line")
    method, target, version = parts
    if method in (b"TRACE", b"TRACK", b"CONNECT"):  # TRACE echoes the request, secret included
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
    drop = {k.lower().encode() for k, _ in headers} | _NOT_FORWARDED
    kept = [b" ".join((method, target, version)), f"Host: {name}".encode()]
    kept += [ln for ln in lines[1:] if ln and ln.split(b":", 1)[0].strip().lower() not in drop]
    kept += [f"{k}: {v}".encode() for k, v in headers] + [b"Connection: close"]
    return b"\r\n".join(kept) + b"\r\n\r\n"


class Injector:
    def __init__(self, ca: BoxCA) -> None:
        self.ca = ca

    async def serve(self, link: Any, name: str, ip: str, port: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, rec: audit.AuditRecord) -> None:
        if port != 443:
            rec.injected = False
            rec.reason = "credentials are injected over TLS (port 443) only"
            writer.transport.abort()
            return
        try:
            await writer.start_tls(self.ca.server_context(name))
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(
                ip, port, ssl=upstream_context(), server_hostname=name, limit=1 << 16), 10)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
            rec.reason = f"credential injection failed: {type(e).__name__}: {e}"[:300]
            writer.transport.abort()
            return
        if len(head) > MAX_HEAD:
            writer.transport.abort()
            return
        try:
            out = rewrite_head(head[:-4], name, link.policy.credentials_for(name, port))
        except HeadRefused as e:
            from .proxy_http import response

            rec.injected = False
            rec.reason = f"credential injection refused: {e}"
            writer.write(response("400 Bad Request", rec.reason))
            await writer.drain()
            writer.close()
            up_w.transport.abort()
            return
        rec.bytes_up += len(head)
        up_w.write(out)
        await relay_streams(link, reader, writer, up_r, up_w, rec)
