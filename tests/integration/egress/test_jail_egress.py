"""Jail boxes behind the egress gateway, attacked from Python, Node and bash inside the box."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from execbox.egress.policy import EgressDenied

from .conftest import audited, jail_with

PY_FETCH = """
import json, ssl, sys, urllib.request
def main(url, cafile=None):
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=8, context=ctx) as r:
            return {"ok": True, "status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"ok": False, "status": e.code, "body": e.read().decode()}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
"""

NODE_FETCH = """
async function main(a) {
  try { const r = await fetch(a.url); return {ok: r.ok, status: r.status, body: await r.text()}; }
  catch (e) { return {ok: false, error: String(e.cause || e)}; }
}
"""


@pytest.fixture(scope="module")
def allow_jail(fakenet):
    p = jail_with("allowlist", [fakenet.name("www"), fakenet.name("rebind"), fakenet.name("meta"),
                                f"{fakenet.name('hostaddr')}:80|8080"])
    yield p
    p.shutdown()


@pytest.fixture
def abox(allow_jail, fakenet):
    inst = allow_jail.create_instance(session_id="egress-t")
    allow_jail.write_file(inst.instance_id, "ca.pem", fakenet.ca_pem)
    yield inst.instance_id
    allow_jail.destroy_instance(inst.instance_id)


def py(p, iid, url, cafile=None):
    r = p.execute_code(iid, PY_FETCH, "python", 30, {"url": url, "cafile": cafile})
    assert r.exit_code == 0, r
    return r.result


def test_allowed_host_from_python_node_and_curl(allow_jail, abox, fakenet):
    www = fakenet.name("www")
    r = py(allow_jail, abox, f"http://{www}/hello")
    assert r["status"] == 200 and json.loads(r["body"])["host"] == www
    r = py(allow_jail, abox, f"https://{www}/tls", "/workspace/ca.pem")
    assert r["status"] == 200 and json.loads(r["body"])["tls"] is True
    r = allow_jail.execute_code(abox, NODE_FETCH, "javascript", 30, {"url": f"http://{www}/node"})
    assert r.result["status"] == 200 and json.loads(r.result["body"])["path"] == "/node", r
    r = allow_jail.run_command(abox, f"curl -sS -m 8 --cacert /workspace/ca.pem https://{www}/curl", 30)
    assert r.exit_code == 0 and json.loads(r.stdout)["path"] == "/curl", r
    assert r.metadata["network"]["network"] == "allowlist"
    run_id = r.metadata["egress_run_id"]
    recs = audited(lambda x: x.run_id == run_id, session_id="egress-t", decision="allowed")
    assert any(x.host == www and x.port == 443 and x.bytes_down > 0 for x in recs)
    assert any(x.run_id == run_id for x in recs)  # audit rows name the run


def test_unlisted_host_and_direct_ip_denied(allow_jail, abox, fakenet):
    r = py(allow_jail, abox, f"http://{fakenet.name('other')}/")
    assert not r["ok"] and "Name or service not known" in r["error"]
    r = py(allow_jail, abox, f"http://{fakenet.server_ip}/")
    assert r["status"] == 403 and "not in the allow list" in r["body"]
    r = allow_jail.run_command(abox, f"curl -sS -m 8 https://{fakenet.server_ip}/ -k; echo rc=$?", 30)
    assert "rc=0" not in r.stdout, r  # TLS to a denied address: reset, never a response
    r = allow_jail.run_command(abox, f"curl -sS -m 8 http://{fakenet.name('other')}/; echo rc=$?", 30)
    assert "rc=6" in r.stdout and "Could not resolve host" in r.stderr, r
    r = allow_jail.execute_code(abox, NODE_FETCH, "javascript", 30, {"url": f"http://{fakenet.server_ip}/"})
    assert r.result["status"] == 403, r
    recs = audited(lambda x: x.ip == fakenet.server_ip and x.decision == "denied", session_id="egress-t")
    assert any(x.ip == fakenet.server_ip and x.decision == "denied" for x in recs)


def test_a_refusal_is_audited_before_the_box_reads_it(allow_jail, abox, fakenet):
    """A slow audit sink holds the gateway's 403 back: code that sees a refusal finds it audited."""
    from execbox.egress import audit

    seen: list[float] = []

    def slow_sink(rec):
        if rec.decision == "denied" and rec.ip == fakenet.server_ip:
            time.sleep(0.3)
            seen.append(time.time())

    code = ("import time, urllib.request\n"
            "def main(url):\n"
            "    try:\n"
            "        urllib.request.urlopen(url, timeout=8)\n"
            "    except urllib.error.HTTPError as e:\n"
            "        return {'status': e.code, 'at': time.time()}\n")
    audit.add_sink(slow_sink)
    try:
        r = allow_jail.execute_code(abox, code, "python", 30, {"url": f"http://{fakenet.server_ip}/"})
    finally:
        audit.remove_sink(slow_sink)
    assert r.result["status"] == 403, r
    assert len(seen) == 1 and seen[0] <= r.result["at"]


def test_refused_connections_past_the_rate_are_counted_and_summed_up(allow_jail, fakenet):
    """A box opening refused connections in a loop (~300 a second here, thousands with more
    sockets) gets at most 20 rows a second; the rest are counted exactly and summed up."""
    from execbox.egress import audit

    iid = allow_jail.create_instance(session_id="tcp-flood").instance_id
    before = audit.counts().get(("tcp", "denied"), 0)
    started = time.monotonic()
    try:
        r = allow_jail.execute_code(iid, """
import socket
for _ in range(300):
    try:
        socket.create_connection(("10.9.9.9", 80), timeout=2).close()
    except OSError:
        pass
""", "python", 60)
        assert r.exit_code == 0, r
        deadline = time.monotonic() + 20  # the gateway may still be taking the last ones off its backlog
        while audit.counts().get(("tcp", "denied"), 0) - before < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        allow_jail.destroy_instance(iid)  # the box goes: what it held back is summed up
    elapsed = time.monotonic() - started

    def rows() -> tuple[list, list[int]]:  # the last summing-up row comes as the box is torn down
        recs = audit.recent(session_id="tcp-flood", limit=10000)
        return ([x for x in recs if x.ip == "10.9.9.9"],
                [int(x.reason.split()[0]) for x in recs if "more connections refused within one second" in x.reason])

    deadline = time.monotonic() + 10
    own, summed = rows()
    while len(own) + sum(summed) < 300 and time.monotonic() < deadline:
        time.sleep(0.05)
        own, summed = rows()
    assert audit.counts()[("tcp", "denied")] - before == 300  # the metrics count every one
    assert len(own) + sum(summed) == 300, (len(own), summed)  # and the rows account for every one
    assert summed and len(own) <= 20 * (int(elapsed) + 2), (len(own), elapsed)


def test_connections_still_queued_at_the_gateway_when_the_box_goes_are_audited(allow_jail):
    """The kernel completes a box's handshake with the gateway's listener before the gateway
    accepts; those still queued when the box is torn down get a row each (Gateway._drain_backlog)
    instead of a reset that leaves none. The gateway stops accepting this box's connections for
    the test, so they stay queued."""
    from execbox.egress import audit
    from execbox.egress.gateway import BOX_GONE, gateway
    from execbox.providers.agent_egress import egress_link

    iid = allow_jail.create_instance(session_id="backlog").instance_id
    try:
        link = egress_link(allow_jail._get(iid).box)

        async def stop_accepting() -> None:
            asyncio.get_running_loop().remove_reader(link._tcp.fileno())

        gateway()._run(stop_accepting())
        r = allow_jail.execute_code(iid, """
import socket
held = [socket.create_connection(dst, timeout=5) for dst in (("10.9.9.8", 80), ("10.9.9.9", 8080))]
print(len(held))
""", "python", 30)
        assert r.exit_code == 0 and r.stdout == "2\n", r
    finally:
        allow_jail.destroy_instance(iid)
    deadline = time.monotonic() + 20  # the box is torn down in the background
    rows: list = []
    while len(rows) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        rows = [x for x in audit.recent(session_id="backlog") if x.reason == BOX_GONE]
    assert sorted((x.ip, x.port, x.decision) for x in rows) == [("10.9.9.8", 80, "denied"),
                                                                 ("10.9.9.9", 8080, "denied")]


def test_rebinding_metadata_and_host_addresses_denied(allow_jail, abox, fakenet):
    r = py(allow_jail, abox, f"http://{fakenet.name('rebind')}/")  # 1st answer: the server; at connect: 127.0.0.1
    assert r["status"] == 403 and "always-denied" in r["body"], r
    for url in (f"http://{fakenet.name('meta')}/", "http://169.254.169.254/latest/meta-data/",
                f"http://{fakenet.name('hostaddr')}:8080/", f"http://{fakenet.host_ip}:8080/",
                "http://10.0.0.1/", "http://192.168.1.1/", "http://127.0.0.1:15001/"):
        r = py(allow_jail, abox, url)
        assert r.get("status") == 403 or not r["ok"], (url, r)
        assert r.get("status") != 200, (url, r)


def test_ipv6_udp_icmp_raw_and_neighbours_denied(allow_jail, abox):
    code = """
import errno, socket
out = {}
for name, fam, addr in (("v6_loop", socket.AF_INET6, ("::1", 80)), ("v6_pub", socket.AF_INET6, ("2001:db8::1", 80))):
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(3)
    try: s.connect(addr); out[name] = "connected"
    except OSError as e: out[name] = e.errno
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try: u.sendto(b"x", ("203.0.113.9", 9999)); u.settimeout(1); u.recv(10); out["udp"] = "got reply"
except OSError as e: out["udp"] = e.errno
for name, args in (("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("ping", (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))):
    try: socket.socket(*args); out[name] = "created"
    except OSError as e: out[name] = e.errno
s = socket.socket(); s.settimeout(3)
try: s.connect(("198.18.255.1", 80)); s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n"); out["peer"] = s.recv(100).decode()
except OSError as e: out["peer"] = e.errno
print(out)
"""
    r = allow_jail.execute_code(abox, code, "python", 30)
    out = eval(r.stdout)  # noqa: S307 - our own print of a dict of ints/strings
    assert out["v6_loop"] != "connected" and out["v6_pub"] != "connected", out
    assert out["udp"] != "got reply" and out["raw"] != "created" and out["ping"] != "created", out
    assert "403" in str(out["peer"]) or isinstance(out["peer"], int), out


def test_live_narrowing_and_no_widening(allow_jail, abox, fakenet):
    www = fakenet.name("www")
    assert py(allow_jail, abox, f"http://{www}/")["status"] == 200
    with pytest.raises(EgressDenied) as e:
        allow_jail.set_network_policy(abox, "open")
    assert e.value.http_status == 403
    with pytest.raises(EgressDenied):
        allow_jail.set_network_policy(abox, "allowlist", [fakenet.name("other")])
    eff = allow_jail.set_network_policy(abox, "allowlist", [f"{www}:443"])
    assert eff == {"network": "allowlist", "allow": [f"{www}:443"]}
    r = py(allow_jail, abox, f"http://{www}/")  # port 80 no longer allowed, without restarting the box
    assert r.get("status") == 403, r
    assert py(allow_jail, abox, f"https://{www}/", "/workspace/ca.pem")["status"] == 200
    allow_jail.set_network_policy(abox, "none")
    r = py(allow_jail, abox, f"https://{www}/", "/workspace/ca.pem")
    assert not r["ok"], r
    meta = allow_jail.execute_code(abox, "pass", "python", 30).metadata
    assert meta["limits"]["network"] == meta["network"]["network"] == "none"  # the session's, not the provider's


def test_open_still_denies_private_ranges(fakenet):
    p = jail_with("open")
    try:
        iid = p.create_instance().instance_id
        assert py(p, iid, f"http://{fakenet.name('anything')}/")["status"] == 200
        assert py(p, iid, f"http://{fakenet.server_ip}/")["status"] == 200
        for url in ("http://169.254.169.254/", "http://10.1.2.3/", "http://172.16.0.1/", "http://192.168.0.1/",
                    f"http://{fakenet.host_ip}/", f"http://{fakenet.name('rebind')}/"):
            r = py(p, iid, url)
            assert r.get("status") == 403, (url, r)
        # "narrowing" to a denied range would open it: the session's and the run's are both refused
        for entry in ("169.254.169.254/32:80", f"{fakenet.host_ip}/32:80", "10.0.0.0/8:80"):
            with pytest.raises(EgressDenied):
                p.set_network_policy(iid, "allowlist", [entry])
            with pytest.raises(EgressDenied), p.network_for_run(iid, "allowlist", [entry]):
                pass
        assert p.effective_network(iid) == {"network": "open", "allow": []}
        assert py(p, iid, f"http://{fakenet.host_ip}/").get("status") == 403
    finally:
        p.shutdown()


def test_a_session_narrowed_during_a_run_stays_narrowed_after_it(allow_jail, abox, fakenet):
    www = fakenet.name("www")
    with allow_jail.network_for_run(abox, "allowlist", [www, fakenet.name("meta")]) as during:
        assert during["allow"] == [f"{www}:80|443", f"{fakenet.name('meta')}:80|443"]
        assert allow_jail.set_network_policy(abox, "allowlist", [f"{www}:443"])["allow"] == [f"{www}:443"]
        assert allow_jail.effective_network(abox)["allow"] == [f"{www}:443"]  # both narrowings hold
    # the run's end puts back the session's policy as it is now, not as it was when the run began
    assert allow_jail.effective_network(abox) == {"network": "allowlist", "allow": [f"{www}:443"]}
    assert py(allow_jail, abox, f"http://{www}/").get("status") == 403
    with allow_jail.network_for_run(abox, "allowlist", [f"{www}:443"]):
        allow_jail.set_network_policy(abox, "none")
    assert allow_jail.effective_network(abox)["network"] == "none"
    assert not py(allow_jail, abox, f"https://{www}/", "/workspace/ca.pem")["ok"]


def test_narrowing_cuts_an_open_gateway_connection_it_no_longer_allows(fakenet):
    """A connection opened before a narrowing that drops its destination ends with the narrowing;
    one the narrowed policy still allows goes on.

    The code answers one request on each connection (so the gateway relays both), says so with
    a ``connected`` file and waits for the test's ``narrowed`` file before using them again."""
    import threading

    from execbox.egress import audit

    www, api = fakenet.name("www"), fakenet.name("api")
    p = jail_with("allowlist", [www, api])
    try:
        iid = p.create_instance(session_id="narrow-open").instance_id
        code = f"""
import os, socket, time
def ask(s, h, version):
    s.sendall(f"GET /bytes/5 HTTP/{{version}}\\r\\nHost: {{h}}\\r\\n\\r\\n".encode())
    got = b""
    while not (b"\\r\\n\\r\\n" in got and len(got.partition(b"\\r\\n\\r\\n")[2]) >= 5):
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return got.decode().split("\\r\\n")[0]
held = {{h: socket.create_connection((h, 80), timeout=5) for h in ("{www}", "{api}")}}
for h, s in held.items():
    assert ask(s, h, "1.1").startswith("HTTP/1.1 200"), h  # relayed both ways: open at the gateway
open("connected", "w").close()
t = time.monotonic()
while not os.path.exists("narrowed") and time.monotonic() - t < 60:
    time.sleep(0.05)
for h, s in held.items():
    try:
        print(h, ask(s, h, "1.0") or "EOF")
    except OSError as e:
        print(h, type(e).__name__)
"""
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", p.execute_code(iid, code, "python", 120)),
                             daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not p.glob(iid, "connected") and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.glob(iid, "connected"), result
        p.set_network_policy(iid, "allowlist", [api])
        p.write_file(iid, "narrowed", "")
        t.join(60)
        r = result["r"]
        out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert out[api].startswith("HTTP/1.1 200") or out[api].startswith("HTTP/1.0 200"), r  # untouched
        assert out[www] in ("EOF", "ConnectionResetError", "BrokenPipeError"), r  # cut by the narrowing
        recs = audited(lambda x: x.host == www and "narrowed" in x.reason, session_id="narrow-open")
        assert any(x.host == www and x.decision == "limited" and "narrowed" in x.reason for x in recs), recs
        assert not any(x.host == api and "narrowed" in x.reason for x in audit.recent(session_id="narrow-open"))
    finally:
        p.shutdown()


def test_none_has_no_network_at_all(fakenet):
    p = jail_with("none")
    try:
        iid = p.create_instance().instance_id
        r = py(p, iid, f"http://{fakenet.server_ip}/")
        assert not r["ok"] and "unreachable" in r["error"].lower(), r
    finally:
        p.shutdown()


def test_box_to_box_denied(allow_jail, fakenet):
    a = allow_jail.create_instance().instance_id
    b = allow_jail.create_instance().instance_id
    try:
        server = """
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 8000)); s.listen()
print("listening")
"""
        assert allow_jail.execute_code(b, server, "python", 10, context_id="srv").stdout == "listening\n"
        for ip in ("198.18.255.2", "198.18.255.1", "198.19.0.1"):
            r = py(allow_jail, a, f"http://{ip}:8000/")
            assert r.get("status") == 403 or not r["ok"], (ip, r)
            assert r.get("status") != 200
    finally:
        allow_jail.destroy_instance(a)
        allow_jail.destroy_instance(b)


def test_per_box_caps(fakenet, monkeypatch):
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_BYTES", str(2 * 1024 * 1024))
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_CONNECTIONS", "2")
    p = jail_with("allowlist", [fakenet.name("www")])
    try:
        iid = p.create_instance(session_id="caps").instance_id
        www = fakenet.name("www")
        r = p.execute_code(iid, f"""
import socket, urllib.request
held = []
for _ in range(2):
    s = socket.create_connection(("{www}", 80), timeout=5); held.append(s)
try:
    urllib.request.urlopen("http://{www}/third", timeout=5); print("third ok")
except Exception as e:
    print("third refused", e)
for s in held: s.close()
try:
    n = len(urllib.request.urlopen("http://{www}/bytes/{8 * 1024 * 1024}", timeout=20).read())
    print("downloaded", n)
except Exception as e:
    print("cut", type(e).__name__)
""", "python", 60)
        assert "third refused" in r.stdout and "403" in r.stdout, r
        assert "downloaded 8388608" not in r.stdout, r
        # each cap's own row, waited for on its own (one wait for "any limited row" once returned
        # before the refused connection's row was written)
        recs = audited(lambda x: "too many concurrent connections" in x.reason, timeout=15, session_id="caps")
        assert any(x.decision == "denied" and "too many concurrent connections" in x.reason for x in recs)
        recs = audited(lambda x: x.decision == "limited", timeout=15, session_id="caps")
        assert any(x.decision == "limited" and "byte cap" in x.reason for x in recs)
    finally:
        p.shutdown()
