"""The egress gateway's forward proxy (egress/proxy.py) on loopback: auth, decisions, caps, audit.

The upstream is a local HTTP server on 127.0.0.1, reachable only because the policy names it as an
exact CIDR entry (loopback is otherwise always denied). The kubernetes tests attack it from pods.
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import time
import urllib.request

import pytest

from execbox.egress import audit
from execbox.egress.gateway import Limits
from execbox.egress.policy import parse_policy
from execbox.egress.proxy import EgressProxy, Grant, share, unshare

from .conftest import audited

TOKENS = {"pod-a": "tok-a", "pod-b": "tok-b"}


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def upstream():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


class Boxes:
    """A backend: the boxes' tokens and policies (the kubernetes provider in production)."""

    def __init__(self, grants):
        self.grants = grants

    def egress_token(self, box):
        return TOKENS.get(box, "x" * 64)

    def egress_lookup(self, box):
        return self.grants.get(box)


@pytest.fixture
def proxy(upstream):
    grants = {"pod-a": Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-1", "ses-1", "i-1"),
              "pod-b": Grant(parse_policy("none"), "ten-2", None, "i-2")}
    p = EgressProxy(("127.0.0.1", 0), [Boxes(grants)], Limits(max_connections=1, max_bytes=1 << 20))
    p.start()
    yield p
    p.stop()


def raw(proxy, request: bytes, then: bytes = b"") -> bytes:
    with socket.create_connection(proxy.address, timeout=5) as s:
        s.sendall(request)
        if then:
            assert s.recv(4096).startswith(b"HTTP/1.1 200 Connection established")
            s.sendall(then)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def auth(user: str, pw: str) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"{user}:{pw}".encode()) + b"\r\n"


def test_plain_http_through_urllib_and_audit(proxy, upstream):
    url = f"http://pod-a:tok-a@127.0.0.1:{proxy.address[1]}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": url}))
    with opener.open(f"http://127.0.0.1:{upstream}/hello?x=1", timeout=5) as r:
        seen = json.loads(r.read())
    assert seen["path"] == "/hello?x=1"
    headers = {k.lower(): v for k, v in seen["headers"].items()}
    assert "proxy-authorization" not in headers and headers["connection"] == "close"
    recs = audited(lambda r: r.decision == "allowed" and r.bytes_down > 0, box="pod-a")
    rec = next(r for r in recs if r.decision == "allowed")
    assert (rec.kind, rec.ip, rec.port, rec.tenant_id, rec.session_id) == ("tcp", "127.0.0.1", upstream, "ten-1",
                                                                           "ses-1")
    assert rec.bytes_up > 0 and rec.bytes_down > 0 and rec.duration_ms > 0


def test_connect_tunnel(proxy, upstream):
    out = raw(proxy, f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\n".encode() + auth("pod-a", "tok-a") + b"\r\n",
              then=b"GET /tunnel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK") and b'"/tunnel"' in out


@pytest.mark.parametrize("creds", [b"", auth("pod-a", "wrong"), auth("pod-a", "tok-b"), auth("nobody", "x"),
                                   b"Proxy-Authorization: Bearer tok-a\r\n"])
def test_missing_or_bad_credentials_are_407(proxy, upstream, creds):
    before = len(audit.recent(decision="denied", limit=10000))
    out = raw(proxy, f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + creds + b"\r\n")
    assert out.startswith(b"HTTP/1.1 407 ") and b'Proxy-Authenticate: Basic realm="execbox-egress"' in out
    assert b"tok-" not in out
    recs = audit.recent(decision="denied", limit=10000)
    assert len(recs) > before and "credentials" in recs[0].reason


def test_a_refusal_is_audited_before_the_client_reads_it(proxy, upstream):
    """A slow audit sink holds the 407 and the 403 back: whoever reads the refusal finds its record."""
    seen: list[float] = []

    def slow_sink(rec):
        if rec.decision == "denied":
            time.sleep(0.3)
            seen.append(time.monotonic())

    audit.add_sink(slow_sink)
    try:
        for creds, status in ((auth("pod-a", "wrong"), b"407"), (auth("pod-b", "tok-b"), b"403")):
            seen.clear()
            with socket.create_connection(proxy.address, timeout=5) as s:
                s.sendall(f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + creds + b"\r\n")
                out = b""
                while b"\r\n\r\n" not in out and (chunk := s.recv(65536)):  # the head, not the close
                    out += chunk
                read_at = time.monotonic()
            assert out.startswith(b"HTTP/1.1 " + status), out
            assert len(seen) == 1 and seen[0] <= read_at
    finally:
        audit.remove_sink(slow_sink)


@pytest.mark.parametrize("target, why", [
    ("127.0.0.1:1", b"always-denied range (127.0.0.0/8)"),  # port outside the entry: loopback stays denied
    ("169.254.169.254:80", b"always-denied range"),
    ("example.invalid:{up}", b"not allowed by the network policy"),
])
def test_denied_destinations_are_403(proxy, upstream, target, why):
    target = target.format(up=upstream)
    for req in (f"CONNECT {target} HTTP/1.1\r\n", f"GET http://{target}/ HTTP/1.1\r\n"):
        out = raw(proxy, req.encode() + auth("pod-a", "tok-a") + b"\r\n")
        assert out.startswith(b"HTTP/1.1 403 Forbidden") and b"X-Execbox-Egress: denied" in out, out
        assert why in out, out
    rec = audit.recent(box="pod-a", decision="denied")[0]
    assert rec.port == int(target.rsplit(":", 1)[1]) and rec.tenant_id == "ten-1"


def test_policy_none_and_unknown_box_are_refused(proxy, upstream):
    out = raw(proxy, f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + auth("pod-b", "tok-b") + b"\r\n")
    assert out.startswith(b"HTTP/1.1 403") and b"network is none" in out
    TOKENS["pod-gone"] = "tok-gone"
    out = raw(proxy, f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + auth("pod-gone", "tok-gone")
              + b"\r\n")
    assert out.startswith(b"HTTP/1.1 403") and b"not a live box" in out


@pytest.mark.parametrize("addresses", [("10.9.8.7",), ("10.9.8.7", "fd00::7"), ()])
def test_credentials_used_from_another_address_than_the_box_s_are_407(upstream, addresses):
    """A pod's token is in its env, readable by its code: another pod that reads it (or is handed
    it) must not get that pod's policy. The grant names the box's own addresses; the proxy sees
    this client at 127.0.0.1, not one of them."""
    grants = {"pod-a": Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-1", "ses-1", "i-1",
                             addresses)}
    p = EgressProxy(("127.0.0.1", 0), [Boxes(grants)], Limits(max_connections=4, max_bytes=1 << 20))
    p.start()
    try:
        before = audit.counts().get(("tcp", "denied"), 0)
        for req in (f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\n", f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n"):
            out = raw(p, req.encode() + auth("pod-a", "tok-a") + b"\r\n")
            assert out.startswith(b"HTTP/1.1 407 ") and b"not from that box's own address" in out, out
            assert b"tok-a" not in out
        assert audit.counts().get(("tcp", "denied"), 0) - before == 2
        rec = audit.recent(box="?", decision="denied")[0]  # not filed under the pod it claimed
        assert "'pod-a'" in rec.reason and "127.0.0.1" in rec.reason and rec.tenant_id is None
        assert p._boxes.get("pod-a") is None or p._boxes["pod-a"].active == 0
    finally:
        p.stop()


@pytest.mark.parametrize("addresses", [("127.0.0.1",), ("10.9.8.7", "127.0.0.1"), ("::ffff:127.0.0.1",), None])
def test_credentials_used_from_the_box_s_own_address_pass(upstream, addresses):
    """The box's own address (any of a dual-stack pod's, IPv4-mapped written either way), or a
    backend that cannot know its boxes' addresses (None: not checked)."""
    grants = {"pod-a": Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-1", "ses-1", "i-1",
                             addresses)}
    p = EgressProxy(("127.0.0.1", 0), [Boxes(grants)], Limits(max_connections=4, max_bytes=1 << 20))
    p.start()
    try:
        out = raw(p, f"GET http://127.0.0.1:{upstream}/own HTTP/1.1\r\n".encode() + auth("pod-a", "tok-a") + b"\r\n")
        assert out.startswith(b"HTTP/1.1 200 OK") and b'"/own"' in out, out
    finally:
        p.stop()


def test_concurrent_connection_cap(proxy, upstream):
    with socket.create_connection(proxy.address, timeout=5) as held:
        held.sendall(f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\n".encode() + auth("pod-a", "tok-a") + b"\r\n")
        assert held.recv(4096).startswith(b"HTTP/1.1 200")
        out = raw(proxy, f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + auth("pod-a", "tok-a") + b"\r\n")
        assert out.startswith(b"HTTP/1.1 403") and b"too many concurrent connections" in out


def test_bad_request_is_400(proxy):
    out = raw(proxy, b"GET /origin-form HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")


def test_one_shared_proxy_per_address(upstream):
    """A provider rebuilt on a config change shares the address with the one it replaces: the proxy
    serves both backends' boxes and stops only with its last backend."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = ("127.0.0.1", s.getsockname()[1])
    old = Boxes({"pod-a": Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-1", "ses-1")})
    new = Boxes({"pod-b": Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-2", "ses-2")})
    p1 = share(listen, old)
    p2 = share(listen, new)
    assert p1 is p2
    get = f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode()
    for box in ("pod-a", "pod-b"):
        assert raw(p1, get + auth(box, TOKENS[box]) + b"\r\n").startswith(b"HTTP/1.1 200")
    unshare(p1, old)
    assert raw(p1, get + auth("pod-a", "tok-a") + b"\r\n").startswith(b"HTTP/1.1 403")  # old's boxes: gone
    assert raw(p1, get + auth("pod-b", "tok-b") + b"\r\n").startswith(b"HTTP/1.1 200")
    unshare(p2, new)
    with pytest.raises(OSError):
        socket.create_connection(listen, timeout=2).close()


def test_one_client_address_cannot_hold_the_whole_proxy(upstream):
    """Idle connections that never send a head hold a slot each until the head timeout: one client
    address gets PEER_SHARE times a box's cap, and no more, before its credentials are read."""
    from execbox.egress import proxy as px

    p = EgressProxy(("127.0.0.1", 0), [Boxes({})], Limits(max_connections=2, max_bytes=1 << 20))
    p.start()
    held: list[socket.socket] = []
    try:
        before = audit.counts().get(("tcp", "limited"), 0)
        for _ in range(px.PEER_SHARE * 2):
            held.append(socket.create_connection(p.address, timeout=5))
        time.sleep(0.2)
        with socket.create_connection(p.address, timeout=5) as extra:  # accepted by the kernel, then cut
            extra.settimeout(5)
            try:
                got = extra.recv(100)
            except ConnectionResetError:
                got = b""
            assert got == b""
        assert audit.counts().get(("tcp", "limited"), 0) - before == 1
        held.pop().close()
        time.sleep(0.2)
        with socket.create_connection(p.address, timeout=5) as again:  # a slot is free again
            again.sendall(b"garbage\r\n\r\n")
            assert again.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        for s in held:
            s.close()
        p.stop()


def test_refusals_from_one_client_get_bounded_rows_and_no_other_pod_s_name(proxy, upstream):
    budget = proxy._refusals["127.0.0.1"] = audit.RowBudget()
    budget.clock = lambda: 100.0  # all in one second, however slow this machine is
    before_rows = len(audit.recent(limit=10000))
    before = audit.counts().get(("tcp", "denied"), 0)
    request = f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\n".encode() + auth("pod-a\x1b[2J", "wrong") + b"\r\n"
    for _ in range(60):
        assert raw(proxy, request).startswith(b"HTTP/1.1 407")
    assert audit.counts().get(("tcp", "denied"), 0) - before == 60  # each one counted
    rows = audit.recent(limit=10000)[: len(audit.recent(limit=10000)) - before_rows]
    assert len(rows) == 20 and budget.drain() == 40  # 20 rows a second; the rest counted, summed up later
    mine = [r for r in rows if "claimed box" in r.reason]
    assert mine and all(r.box == "?" and "\x1b" not in r.reason for r in mine)


def test_open_tunnels_follow_their_pod_s_narrowing_and_its_end(upstream):
    """A tunnel opened before its pod's policy was narrowed (on any replica: the proxy re-reads
    it) is cut once the policy no longer allows it, and every tunnel of a pod that is gone; a
    tunnel still allowed goes on."""
    wide = parse_policy("allowlist", [f"127.0.0.1/32:{upstream}", "127.0.0.2/32:443"])
    grants = {b: Grant(wide, "ten-1", f"ses-{b}", b) for b in ("pod-a", "pod-b")}
    looked: list[str] = []  # the boxes looked up, in order (the sweep's re-checks among them)

    class Counted(Boxes):
        def egress_lookup(self, box):
            looked.append(box)
            return super().egress_lookup(box)

    p = EgressProxy(("127.0.0.1", 0), [Counted(grants)], Limits(max_connections=4, max_bytes=1 << 20))
    p.start()

    def tunnel(box: str) -> socket.socket:
        s = socket.create_connection(p.address, timeout=5)
        s.sendall(f"CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\n".encode() + auth(box, TOKENS[box]) + b"\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 Connection established")
        return s

    def ask(s: socket.socket) -> bytes:
        """The status line of one more request on the tunnel (its whole answer read)."""
        try:
            s.sendall(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got and (chunk := s.recv(4096)):
                got += chunk
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length:")), b"0"))
            while len(body) < length and (chunk := s.recv(4096)):
                body += chunk
            return head[:15]
        except OSError as e:
            return type(e).__name__.encode()

    try:
        a, b = tunnel("pod-a"), tunnel("pod-b")
        assert ask(a) == ask(b) == b"HTTP/1.1 200 OK"
        grants["pod-a"] = Grant(parse_policy("allowlist", ["127.0.0.2/32:443"]), "ten-1", "ses-pod-a", "pod-a")
        del grants["pod-b"]  # the pod went
        deadline = time.monotonic() + 15  # the sweep's period is 1 s
        for s in (a, b):
            while (answer := ask(s)) == b"HTTP/1.1 200 OK" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert answer in (b"", b"ConnectionResetError", b"BrokenPipeError")
        recs = audited(lambda r: "narrowed" in r.reason, 15, box="pod-a")
        assert any(r.decision == "limited" and "narrowed" in r.reason for r in recs), recs
        recs = audited(lambda r: "gone" in r.reason, 15, box="pod-b")
        assert any(r.decision == "limited" and "the box is gone" in r.reason for r in recs), recs

        grants["pod-a"] = Grant(wide, "ten-1", "ses-pod-a", "pod-a")
        a2 = tunnel("pod-a")
        grants["pod-a"] = Grant(parse_policy("allowlist", [f"127.0.0.1/32:{upstream}"]), "ten-1", "ses-pod-a",
                                "pod-a")  # narrowed, but this tunnel is still listed
        seen = len(looked)
        deadline = time.monotonic() + 15
        while "pod-a" not in looked[seen:] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "pod-a" in looked[seen:], "no sweep re-checked the tunnel"
        # a second re-check means the sweep that read the narrowed policy has finished (a sweep
        # that cut the tunnel leaves nothing to re-check: then the wait runs out)
        deadline = time.monotonic() + 15
        while looked[seen:].count("pod-a") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ask(a2) == b"HTTP/1.1 200 OK"
        for s in (a, b, a2):
            s.close()
    finally:
        p.stop()
