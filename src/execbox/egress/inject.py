"""Credential injection: the gateway adds secret headers for one host; the box never sees them.

Only connections to a host whose allow entry carries headers are intercepted, and only on port
443: the gateway terminates the box's TLS with a leaf certificate for that host, signed by a CA
made for this box alone (``BoxCA``; the box trusts it through a CA bundle mounted at the usual
paths), reads the request head, drops any header of the same name the box sent (a
placeholder such as ``Authorization: Bearer x``), adds the secret ones, sets ``Host`` to that
host (``rewrite_head``), forces ``Connection: close`` and sends that over its own verified TLS
connection to the host. The rest is relayed through ``inject_http``'s rules: one request per
intercepted connection (so every request head passes through here) and a response scrubbed of
the secret. Plain HTTP never carries an injected secret. TLS and X.509 are the ``ssl`` module
and ``cryptography``; nothing hand-made.

Everything here runs on the gateway's one event loop, which serves every box: work that takes
milliseconds (loading a trust store, making a key and certificate) is done once and kept, and
the first time off the loop, so one box opening intercepted connections does not stall the
egress of every other.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl
import tempfile
from typing import Any

from ..settings import env_duration
from . import audit
from .inject_http import HeadRefused, Scrubber, request_body, rewrite_head, secret_values
from .relay import relay_streams

__all__ = ["BOX_BUNDLE", "BOX_ENV", "BoxCA", "HeadRefused", "Injector", "rewrite_head", "upstream_context"]

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

    def ready(self, host: str) -> ssl.SSLContext | None:
        """The leaf context for ``host`` if already made (cheap enough for the event loop)."""
        return self._leaf.get(host)

    def server_context(self, host: str) -> ssl.SSLContext:
        """The leaf context for ``host``, made once (a key, a signature and a file: some ms, so
        the injector calls this off the event loop; safe from several threads)."""
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
        fd, path = tempfile.mkstemp(dir=self.dir, prefix="leaf-", suffix=".pem")  # 0600, a name per call
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


_upstream: tuple[str, ssl.SSLContext] | None = None  # (EXECBOX_EGRESS_UPSTREAM_CA it was built for, context)


def _upstream_ready() -> ssl.SSLContext | None:
    """The shared upstream context if it is built for the current EXECBOX_EGRESS_UPSTREAM_CA."""
    built = _upstream
    if built is not None and built[0] == os.environ.get("EXECBOX_EGRESS_UPSTREAM_CA", "").strip():
        return built[1]
    return None


def upstream_context() -> ssl.SSLContext:
    """Verified TLS to the real host (system trust, plus EXECBOX_EGRESS_UPSTREAM_CA if set).

    One context per process, rebuilt only when that variable changes: building one parses the
    system trust store (~45 ms), and doing it per connection on the gateway's loop let one box
    stall every box's egress. An SSLContext is safe to share between connections."""
    global _upstream
    ready = _upstream_ready()
    if ready is not None:
        return ready
    extra = os.environ.get("EXECBOX_EGRESS_UPSTREAM_CA", "").strip()
    ctx = ssl.create_default_context()
    if extra:
        ctx.load_verify_locations(cafile=extra)
    ctx.set_alpn_protocols(["http/1.1"])
    _upstream = (extra, ctx)
    return ctx


IDLE_TIMEOUT = 300.0


def idle_timeout() -> float:
    """EXECBOX_EGRESS_INTERCEPT_IDLE (a duration), or 300 s; a bad value is SB002 naming it."""
    return env_duration("EXECBOX_EGRESS_INTERCEPT_IDLE", IDLE_TIMEOUT)


class Injector:
    def __init__(self, ca: BoxCA) -> None:
        self.ca = ca
        # an intercepted connection with no byte either way for this long is closed: an upstream
        # that keeps it open (or a box that went quiet) would otherwise hold a connection slot
        self.idle = idle_timeout()

    async def serve(self, link: Any, name: str, ip: str, port: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, rec: audit.AuditRecord) -> None:
        if port != 443:
            rec.injected = False
            rec.reason = "credentials are injected over TLS (port 443) only"
            writer.transport.abort()
            return
        loop = asyncio.get_running_loop()
        try:
            leaf = self.ca.ready(name) or await loop.run_in_executor(None, self.ca.server_context, name)
            await writer.start_tls(leaf)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
            rec.reason = f"credential injection failed: {type(e).__name__}: {e}"[:300]
            writer.transport.abort()
            return
        if len(head) > MAX_HEAD:
            writer.transport.abort()
            return
        creds = link.policy.credentials_for(name, port)
        try:
            out = rewrite_head(head[:-4], name, creds)
            body = request_body(head[:-4])
        except HeadRefused as e:
            from .proxy_http import response

            rec.injected = False
            rec.reason = f"credential injection refused: {e}"
            writer.write(response("400 Bad Request", rec.reason))
            await writer.drain()
            writer.close()
            return
        # Only now the upstream: a box that connects and sends no acceptable head costs no upstream
        # TLS handshake on the shared loop, and the credentialed host never sees its connection.
        try:
            ctx = _upstream_ready() or await loop.run_in_executor(None, upstream_context)
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(
                ip, port, ssl=ctx, server_hostname=name, limit=1 << 16), 10)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            rec.reason = f"credential injection failed: {type(e).__name__}: {e}"[:300]
            writer.transport.abort()
            return
        rec.bytes_up += len(head)
        up_w.write(out)
        await relay_streams(link, reader, writer, up_r, up_w, rec, up_edit=body,
                            down_edit=Scrubber(secret_values(creds)), idle=self.idle)
