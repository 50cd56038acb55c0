"""A "fake internet" for egress tests and benches: never leaves the machine.

A network namespace ``exbfi<hex>`` joined to the host by a veth pair on a random /30 of
203.0.113.0/24 (TEST-NET-3: public-looking, so it is not in an always-denied range) runs an
HTTP (:80) and HTTPS (:443) server that echo the request (method, path, Host, headers, a POST's
body) as JSON and record each request it read (``FakeNet.received``), and ``/bytes/N`` returns N
bytes. Paths under ``/keepalive`` keep the connection open whatever the request's ``Connection``
says (an upstream that ignores ``Connection: close``); ``/drip`` echoes the request headers as
response headers too, and sends the whole response a few bytes at a time. A dnslib server on
the host's loopback answers the fixture's names (``*.<prefix>.test``), including a rebinding
name (first the server, then 127.0.0.1). Everything is named with the unique prefix and removed by ``close()``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SERVER = r'''
import http.server, json, os, ssl, sys, threading, time, urllib.parse
LOG, LOCK = os.path.join(os.path.dirname(sys.argv[2]), "requests.jsonl"), threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def body(self):
        if self.command != "POST":
            return b""
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().strip(), 16)
                out += self.rfile.read(n); self.rfile.readline()
                if not n:
                    return out
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))
    def do_GET(self):
        seen = {"method": self.command, "path": self.path, "host": self.headers.get("Host"),
                "headers": dict(self.headers), "tls": isinstance(self.connection, ssl.SSLSocket),
                "body": self.body().decode("latin-1")}
        with LOCK, open(LOG, "a") as f:
            f.write(json.dumps(seen) + "\n")
        if self.path.startswith("/keepalive"):
            self.reply(json.dumps(seen).encode())
            self.close_connection = False  # whatever the request's Connection said
            return
        if self.path.startswith("/drip"):
            body = json.dumps(seen).encode()
            head = "".join(f"X-Echo-{k}: {v}\r\n" for k, v in self.headers.items())
            raw = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode("latin-1") + body
            for i in range(0, len(raw), 5):
                self.wfile.write(raw[i:i + 5]); self.wfile.flush(); time.sleep(0.005)
            self.close_connection = True
            return
        if self.path.startswith("/pkgs/") and len(sys.argv) > 4:
            return self.static(self.path[len("/pkgs/"):].split("?")[0])
        if self.path.startswith("/bytes/"):
            n = int(self.path.split("/")[2]); self.send_response(200)
            self.send_header("Content-Length", str(n)); self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                self.wfile.write(chunk[:min(n, 65536)]); n -= 65536
            return
        self.reply(json.dumps(seen).encode())
    def reply(self, body):
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def static(self, rel):
        # a local package index: files under the root; "@@HOST@@" becomes this request's Host
        path = os.path.realpath(os.path.join(sys.argv[4], urllib.parse.unquote(rel)))
        if not path.startswith(os.path.realpath(sys.argv[4])):
            return self.send_error(404)
        if os.path.isdir(path):
            path = os.path.join(path, "index.html")
        if not os.path.isfile(path):
            return self.send_error(404)
        data = open(path, "rb").read()
        kind = "application/octet-stream"
        if path.endswith(".html"):
            kind = "text/html"
        elif path.endswith(".json") or "." not in os.path.basename(path):
            kind = "application/json"
        if not path.endswith((".whl", ".tgz")):
            data = data.replace(b"@@HOST@@", (self.headers.get("Host") or "").encode())
        self.send_response(200); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    do_POST = do_GET
    def log_message(self, *a): pass
ip, cert, key = sys.argv[1:4]  # argv[4]: optional root of /pkgs/ (tests/pkgindex.py)
plain = http.server.ThreadingHTTPServer((ip, 80), H)
tls = http.server.ThreadingHTTPServer((ip, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
'''


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


def make_ca_and_cert(names: list[str], ip: str, out_dir: str) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for ``names`` and ``ip`` (cryptography)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "execbox fake internet CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(ip))]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False).sign(ca_key, hashes.SHA256()))
    paths = tuple(os.path.join(out_dir, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths  # type: ignore[return-value]


@dataclass
class FakeNet:
    prefix: str
    server_ip: str
    host_ip: str
    domain: str
    dns_port: int
    ca_pem: str
    _proc: subprocess.Popen | None = None
    _dns: object = None
    _tmp: str = ""
    ca_file: str = ""
    pkg_root: str = ""  # served at http(s)://<server>/pkgs/ (tests/pkgindex.py writes an index there)
    rebind_hits: dict[str, int] = field(default_factory=dict)

    def name(self, label: str) -> str:
        return f"{label}.{self.domain}"

    def received(self, path_prefix: str = "/") -> list[dict]:
        """The requests the server has read (method, path, host, headers, body), oldest first."""
        import json

        try:
            with open(os.path.join(self._tmp, "requests.jsonl"), encoding="utf-8") as f:
                rows = [json.loads(ln) for ln in f if ln.strip()]
        except FileNotFoundError:
            return []
        return [r for r in rows if r["path"].startswith(path_prefix)]

    @property
    def server_pid(self) -> int:
        """The HTTP(S) server's process (``ip netns exec`` execs it in place)."""
        assert self._proc is not None
        return self._proc.pid

    @property
    def resolver(self) -> str:
        return f"127.0.0.1:{self.dns_port}"

    def close(self) -> None:
        if self._dns is not None:
            self._dns.stop()  # type: ignore[attr-defined]
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(5)
        _run("ip", "link", "del", f"fih{self.prefix[5:]}", check=False)
        _run("ip", "netns", "del", self.prefix, check=False)
        if self._tmp:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)


def start() -> FakeNet:
    from dnslib import QTYPE, RR, A
    from dnslib.server import BaseResolver, DNSLogger, DNSServer

    hexid = secrets.token_hex(3)
    prefix = f"exbfi{hexid}"
    block = 4 * secrets.randbelow(63) + 4  # a /30 inside 203.0.113.0/24 (never .0/30)
    host_ip, server_ip = f"203.0.113.{block + 1}", f"203.0.113.{block + 2}"
    domain = f"{prefix}.test"
    tmp = tempfile.mkdtemp(prefix=f"{prefix}-")
    fn = FakeNet(prefix, server_ip, host_ip, domain, 0, "", _tmp=tmp)
    try:
        _run("ip", "netns", "add", prefix)
        _run("ip", "link", "add", f"fih{hexid}", "type", "veth", "peer", "name", f"fin{hexid}", "netns", prefix)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", f"fih{hexid}")
        _run("ip", "link", "set", f"fih{hexid}", "up")
        _run("ip", "-n", prefix, "addr", "add", f"{server_ip}/30", "dev", f"fin{hexid}")
        _run("ip", "-n", prefix, "link", "set", f"fin{hexid}", "up")
        _run("ip", "-n", prefix, "link", "set", "lo", "up")
        ca, cert, key = make_ca_and_cert([f"*.{domain}", domain], server_ip, tmp)
        fn.ca_file = ca
        fn.pkg_root = os.path.join(tmp, "pkgs")
        os.makedirs(fn.pkg_root)
        with open(ca, encoding="ascii") as f:
            fn.ca_pem = f.read()
        fn._proc = subprocess.Popen(["ip", "netns", "exec", prefix, sys.executable, "-c", SERVER, server_ip,
                                     cert, key, fn.pkg_root],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert fn._proc.stdout is not None
        line = fn._proc.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"fake internet server did not start: {line}")

        class Resolver(BaseResolver):
            def resolve(self, request, handler):  # noqa: ANN001, ANN201
                reply = request.reply()
                qname = str(request.q.qname).rstrip(".").lower()
                label = qname[: -len(domain) - 1] if qname.endswith("." + domain) else None
                if request.q.qtype != QTYPE.A or label is None:
                    if label is None:
                        reply.header.rcode = 3
                    return reply
                if label == "rebind":
                    n = fn.rebind_hits.get(qname, 0)
                    fn.rebind_hits[qname] = n + 1
                    ip = server_ip if n == 0 else "127.0.0.1"
                elif label == "meta":
                    ip = "169.254.169.254"
                elif label == "hostaddr":
                    ip = host_ip
                else:
                    ip = server_ip
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=0))
                return reply

        dns = DNSServer(Resolver(), port=0, address="127.0.0.1", logger=DNSLogger(logf=lambda _s: None))
        dns.start_thread()
        fn._dns = dns
        fn.dns_port = dns.server.server_address[1]
        deadline = time.monotonic() + 5
        import socket
        while True:
            try:
                socket.create_connection((server_ip, 80), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    except BaseException:
        fn.close()
        raise
    return fn


@contextmanager
def serving() -> Iterator[FakeNet]:
    """A fake internet for the block, with the egress gateway resolving names through its DNS
    (``EXECBOX_EGRESS_RESOLVER``; the previous value is put back)."""
    fn = start()
    old = os.environ.get("EXECBOX_EGRESS_RESOLVER")
    os.environ["EXECBOX_EGRESS_RESOLVER"] = fn.resolver
    try:
        yield fn
    finally:
        if old is None:
            os.environ.pop("EXECBOX_EGRESS_RESOLVER", None)
        else:
            os.environ["EXECBOX_EGRESS_RESOLVER"] = old
        fn.close()
