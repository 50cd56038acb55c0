"""Credential injection past the first request head, against the fake API (tests/fakenet.py).

- A secret the API reflects reaches the box masked, also when the API sends it a few bytes at a
  time (``/drip``: the secret straddles the gateway's reads), in headers and body.
- One request per intercepted connection, even to an upstream that ignores ``Connection: close``
  (``/keepalive``): a pipelined second request, one sent after the first response, or bytes past
  a declared body never reach the API (they would skip the Host and X-Forwarded-* rewrite).
- A connection the box closed, or one idle too long, ends at once, its slot freed and audited
  (they used to hold the box's connection cap until the box went).
"""

from __future__ import annotations

import json

import pytest

from .conftest import audited

SECRET = "sk-live-7c2e91ab40d3-RELAY"
TOKEN = "tok-5d1b7a9e3c0f42"

RAW = r'''
import json, socket, ssl, time
ctx = ssl.create_default_context()

def tls(host):
    return ctx.wrap_socket(socket.create_connection((host, 443), timeout=10), server_hostname=host)

def response(t):
    """One response with a Content-Length body, or b"" at EOF."""
    out = b""
    while b"\r\n\r\n" not in out:
        d = t.recv(65536)
        if not d:
            return out
        out += d
    head, body = out.split(b"\r\n\r\n", 1)
    n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
    while len(body) < n:
        body += t.recv(65536)
    return head + b"\r\n\r\n" + body

def rest(t, wait=8.0):
    """What else arrives: bytes until EOF ('eof'), a reset, or nothing before ``wait`` ('open')."""
    t.settimeout(wait)
    out = b""
    try:
        while True:
            d = t.recv(65536)
            if not d:
                return out.decode("latin-1"), "eof"
            out += d
    except TimeoutError:
        return out.decode("latin-1"), "open"
    except OSError as e:
        return out.decode("latin-1"), type(e).__name__
'''


@pytest.fixture
def upstream_ca(fakenet, monkeypatch):
    monkeypatch.setenv("EXECBOX_EGRESS_UPSTREAM_CA", fakenet.ca_file)


def _provider(fakenet, host):
    from tests.integration.jail.conftest import make_provider

    creds = {host: {"X-Api-Key": SECRET, "Authorization": f"Bearer {TOKEN}"}}
    return make_provider(network="allowlist", network_allow=[host], network_credentials=json.dumps(creds))


def test_a_reflected_secret_reaches_the_box_masked_even_split_across_reads(fakenet, upstream_ca):
    host = fakenet.name("drip")
    code = RAW + f"""
t = tls({host!r})
t.sendall(b"GET /drip/x HTTP/1.1\\r\\nHost: {host}\\r\\nX-Api-Key: placeholder\\r\\nAccept-Encoding: gzip\\r\\n\\r\\n")
print(json.dumps(rest(t)))
"""
    p = _provider(fakenet, host)
    try:
        iid = p.create_instance().instance_id
        r = p.execute_code(iid, code, "python", 60)
        assert r.exit_code == 0, r
        raw, end = json.loads(r.stdout)
    finally:
        p.shutdown()
    assert end == "eof" and raw.startswith("HTTP/1.1 200"), raw
    assert SECRET not in raw and TOKEN not in raw, raw
    head, body = raw.split("\r\n\r\n", 1)
    assert f"X-Echo-X-Api-Key: {'*' * len(SECRET)}" in head.split("\r\n"), head
    assert f"X-Echo-Authorization: {'*' * len('Bearer ' + TOKEN)}" in head.split("\r\n"), head
    echoed = json.loads(body)["headers"]
    assert echoed["X-Api-Key"] == "*" * len(SECRET) and echoed["Accept-Encoding"] == "identity", echoed
    sent = fakenet.received("/drip/x")[-1]["headers"]  # the API itself got the real ones
    assert sent["X-Api-Key"] == SECRET and sent["Authorization"] == f"Bearer {TOKEN}", sent


def test_one_request_per_intercepted_connection(fakenet, upstream_ca):
    host = fakenet.name("pipe")
    h = f"Host: {host}\\r\\n"
    code = RAW + f"""
out = {{}}
t = tls({host!r})   # pipelined: both in one write
t.sendall(b"GET /keepalive/one HTTP/1.1\\r\\n{h}\\r\\n"
          b"GET /keepalive/two HTTP/1.1\\r\\nHost: evil.example\\r\\nX-Forwarded-Host: evil.example\\r\\n\\r\\n")
out["pipelined"] = rest(t)[1]
t = tls({host!r})   # keep-alive reuse after the first response
t.sendall(b"GET /keepalive/a HTTP/1.1\\r\\n{h}\\r\\n")
first = response(t)
t.sendall(b"GET /keepalive/b HTTP/1.1\\r\\nHost: evil.example\\r\\nX-Original-URL: /admin\\r\\n\\r\\n")
out["reuse"] = [first[:12].decode(), rest(t)[1]]
t = tls({host!r})   # bytes past the declared body
t.sendall(b"POST /keepalive/cl HTTP/1.1\\r\\n{h}Content-Length: 5\\r\\n\\r\\n"
          b"helloGET /keepalive/smuggled HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n")
out["overrun"] = rest(t)[1]
t = tls({host!r})   # a chunked body, sent in pieces, arrives whole; the terminating chunk ends it
t.sendall(b"POST /keepalive/chunked HTTP/1.1\\r\\n{h}Transfer-Encoding: chunked\\r\\n\\r\\n6\\r\\nhello \\r\\n")
time.sleep(0.2)
t.sendall(b"5\\r\\nworld\\r\\n0\\r\\n\\r\\n")
out["chunked"] = json.loads(response(t).split(b"\\r\\n\\r\\n", 1)[1])["body"]
t.sendall(b"GET /keepalive/after-chunked HTTP/1.1\\r\\n{h}\\r\\n")
out["after_chunked"] = rest(t)[1]
print(json.dumps(out))
"""
    p = _provider(fakenet, host)
    try:
        iid = p.create_instance().instance_id
        r = p.execute_code(iid, code, "python", 90)
        assert r.exit_code == 0, r
        out = json.loads(r.stdout)
    finally:
        p.shutdown()
    paths = [x["path"] for x in fakenet.received("/keepalive")]
    assert "/keepalive/one" in paths and "/keepalive/a" in paths, paths
    for never in ("/keepalive/two", "/keepalive/b", "/keepalive/smuggled", "/keepalive/after-chunked"):
        assert never not in paths, paths
    assert out["chunked"] == "hello world", out
    assert out["reuse"][0] == "HTTP/1.1 200", out
    # the box's connection is ended, not left hanging, when it sends more
    assert all(out[k] != "open" for k in ("pipelined", "overrun", "after_chunked")) and out["reuse"][1] != "open", out
    why = "one request per intercepted connection"
    recs = [x for x in audited(lambda x: x.host == host and why in x.reason) if x.host == host]
    assert sum(why in x.reason for x in recs) >= 4, [x.reason for x in recs]


def test_closed_and_idle_connections_free_their_slot(fakenet, upstream_ca, monkeypatch):
    """The upstream keeps every connection open: with a cap of 3, six requests the box closes
    after reading each used to leave 3 slots held (requests 4-6 refused, no audit rows)."""
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_CONNECTIONS", "3")
    monkeypatch.setenv("EXECBOX_EGRESS_INTERCEPT_IDLE", "2")
    host = fakenet.name("slots")
    code = RAW + f"""
import urllib.request
codes = []
for i in range(6):
    with urllib.request.urlopen("https://{host}/keepalive/seq%d" % i, timeout=10) as r:
        codes.append((r.status, json.loads(r.read())["path"]))
t = tls({host!r})
t.sendall(b"GET /keepalive/idle HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n")
response(t)
t0 = time.monotonic()
end = rest(t, 15)[1]
print(json.dumps({{"codes": codes, "idle": [end, time.monotonic() - t0]}}))
"""
    p = _provider(fakenet, host)
    try:
        iid = p.create_instance().instance_id
        r = p.execute_code(iid, code, "python", 90)
        assert r.exit_code == 0, r
        out = json.loads(r.stdout)
        assert out["codes"] == [[200, f"/keepalive/seq{i}"] for i in range(6)], out
        assert out["idle"][0] == "eof" and 1.5 < out["idle"][1] < 10, out  # closed by the idle timeout
        recs = audited(lambda x: x.host == host and "no bytes either way" in x.reason)
        mine = [x for x in recs if x.host == host and x.injected and x.decision == "allowed"]
        assert len(mine) == 7 and sum("no bytes either way" in x.reason for x in mine) == 1, [x.reason for x in recs]
    finally:
        p.shutdown()
