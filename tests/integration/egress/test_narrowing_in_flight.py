"""A narrowing reaches connections that are still being decided or dialled, not only relayed ones.

Found by review: the gateway read the policy once, then waited on the lookup (seconds) and the
upstream connect (up to 10 s), and a connection joined the box's relays only after that, so a
narrowing made meanwhile neither saw nor cut it: it was made under the old policy and lived on.
Here a jail box (and a pod of the egress proxy) connects, the test holds the gateway at the lookup
or the connect, narrows, and only then lets it go on."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading

from execbox.egress import audit
from execbox.egress.gateway import Limits
from execbox.egress.link import NARROWED_PENDING
from execbox.egress.policy import parse_policy
from execbox.egress.proxy import EgressProxy, Grant

from .conftest import audited, jail_with
from .test_egress_proxy import TOKENS, Boxes, auth, upstream  # noqa: F401 - upstream is a fixture

CONNECT = """
import socket
def main(host, port):
    try:
        s = socket.create_connection((host, port), timeout=30)
        s.settimeout(30)
        s.sendall(f"GET /raced HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode())
        return s.recv(100).decode() or "EOF"
    except OSError as e:
        return type(e).__name__
"""


def _in_background(p, iid, host: str, port: int) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", p.execute_code(iid, CONNECT, "python", 60,
                                                                         {"host": host, "port": port})),
                         daemon=True)
    t.start()
    return t, out


def test_a_narrowing_cuts_a_connection_whose_lookup_is_in_flight(fakenet, monkeypatch):
    from execbox.egress import gateway as gw

    slow, kept = fakenet.name("slow-decide"), fakenet.name("www")
    entered, release = threading.Event(), threading.Event()
    real = gw.resolve

    async def held(name, box=None):  # noqa: ANN001, ANN202 - the connect's lookup waits for the test
        if name == slow:
            entered.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return await real(name, box)

    monkeypatch.setattr(gw, "resolve", held)
    p = jail_with("allowlist", [slow, kept])
    try:
        iid = p.create_instance(session_id="narrow-deciding").instance_id
        t, out = _in_background(p, iid, slow, 80)
        assert entered.wait(30), out
        p.set_network_policy(iid, "allowlist", [kept])
        # cut when the narrowing returned, while its lookup still waits: refused, on record as such
        recs = audited(lambda x: x.host == slow, 15, session_id="narrow-deciding")
        assert [(x.decision, x.reason) for x in recs if x.host == slow] == [("denied", NARROWED_PENDING)], recs
        release.set()
        t.join(60)
        assert out["r"].result in ("ConnectionResetError", "EOF"), out
        assert not [x for x in audit.recent(session_id="narrow-deciding") if x.decision == "allowed"]
    finally:
        release.set()
        p.shutdown()


def test_a_narrowing_cuts_a_connection_whose_upstream_connect_is_in_flight(fakenet):
    """The fake internet drops SYNs to port 81: the gateway's connect waits (up to 10 s) until the
    narrowing, which ends it. Unfixed, it ended at the connect timeout as an allowed connection."""
    slow = fakenet.name("slow-connect")
    rule = ["INPUT", "-p", "tcp", "--dport", "81", "-j", "DROP"]
    ns = ["ip", "netns", "exec", fakenet.prefix, "iptables", "-w"]
    subprocess.run([*ns, "-A", *rule], check=True, capture_output=True)
    p = jail_with("allowlist", [f"{slow}:81", fakenet.name("www")])
    try:
        iid = p.create_instance(session_id="narrow-dialling").instance_id
        t, out = _in_background(p, iid, slow, 81)
        dropped = 0
        for _ in range(300):  # until the gateway's SYN has arrived (and was dropped): it is dialling
            counters = subprocess.run([*ns, "-L", "INPUT", "-v", "-n", "-x"], check=True, capture_output=True,
                                      text=True).stdout
            dropped = int(next(ln.split()[0] for ln in counters.splitlines() if "dpt:81" in ln))
            if dropped or not t.is_alive():
                break
            threading.Event().wait(0.05)
        assert dropped, out
        p.set_network_policy(iid, "allowlist", [fakenet.name("www")])
        recs = audited(lambda x: x.host == slow, 15, session_id="narrow-dialling")
        assert [(x.decision, x.reason) for x in recs if x.host == slow] == [("denied", NARROWED_PENDING)], recs
        t.join(60)
        assert out["r"].result in ("ConnectionResetError", "EOF"), out
    finally:
        subprocess.run([*ns, "-D", *rule], capture_output=True)
        p.shutdown()


def test_a_narrowing_cuts_an_intercepted_connection_waiting_for_its_request_head(fakenet, monkeypatch):
    """Credential injection terminates the box's TLS, dials the upstream and then waits (up to 30 s)
    for the request head: a narrowing that drops the host meanwhile ends the connection, and the
    head the box sends afterwards never reaches the upstream."""
    import json

    from tests.integration.jail.conftest import make_provider

    monkeypatch.setenv("EXECBOX_EGRESS_UPSTREAM_CA", fakenet.ca_file)
    api, www = fakenet.name("api"), fakenet.name("www")
    p = make_provider(network="allowlist", network_allow=[api, www],
                      network_credentials=json.dumps({api: {"X-Api-Key": "sk-narrowed-in-flight"}}))
    code = f"""
import os, socket, ssl, time
s = ssl.create_default_context().wrap_socket(socket.create_connection(("{api}", 443), timeout=30),
                                             server_hostname="{api}")
open("ready", "w").close()
t = time.monotonic()
while not os.path.exists("narrowed") and time.monotonic() - t < 60:
    time.sleep(0.05)
try:
    s.sendall(b"GET /after-narrowing HTTP/1.1\\r\\nHost: {api}\\r\\n\\r\\n")
    print((s.recv(100) or b"EOF").decode()[:15])
except OSError as e:
    print(type(e).__name__)
"""
    try:
        iid = p.create_instance(session_id="narrow-intercepted").instance_id
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", p.execute_code(iid, code, "python", 90)), daemon=True)
        t.start()
        for _ in range(600):
            if p.glob(iid, "ready") or not t.is_alive():
                break
            threading.Event().wait(0.05)
        assert p.glob(iid, "ready"), out
        p.set_network_policy(iid, "allowlist", [www])
        recs = audited(lambda x: x.host == api, 15, session_id="narrow-intercepted")
        assert [(x.decision, x.reason) for x in recs if x.host == api] == [("denied", NARROWED_PENDING)], recs
        p.write_file(iid, "narrowed", "")
        t.join(60)
        assert out["r"].stdout.strip() in ("EOF", "ConnectionResetError", "SSLEOFError", "BrokenPipeError"), out
        assert not fakenet.received("/after-narrowing")
    finally:
        p.shutdown()


def test_the_proxy_refuses_a_request_whose_pod_was_narrowed_during_its_lookup(upstream, monkeypatch):  # noqa: F811
    """The proxy has no immediate cut (its sweep re-reads a pod's policy every second); a request
    that is still being decided takes the policy the sweep read, instead of relaying under the old."""
    from execbox.egress import gateway as gw
    from execbox.egress import proxy as px

    monkeypatch.setattr(px, "SWEEP", 0.05)
    entered, release = threading.Event(), threading.Event()

    async def held(name, box=None):  # noqa: ANN001, ANN202 - the name resolves to the local upstream, late
        entered.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        from ipaddress import IPv4Address
        return [IPv4Address("127.0.0.1")]

    monkeypatch.setattr(gw, "resolve", held)
    listed = f"127.0.0.1/32:{upstream}"  # the name's address is loopback: only an exact entry reaches it
    grants = {"pod-a": Grant(parse_policy("allowlist", [f"slow.test:{upstream}", listed]), "ten-1", "ses-r", "i")}
    p = EgressProxy(("127.0.0.1", 0), [Boxes(grants)], Limits(max_connections=4, max_bytes=1 << 20))
    p.start()
    got: dict = {}

    def ask() -> None:
        with socket.create_connection(p.address, timeout=30) as s:
            s.sendall(f"GET http://slow.test:{upstream}/raced HTTP/1.1\r\n".encode() + auth("pod-a", TOKENS["pod-a"])
                      + b"\r\n")
            got["answer"] = s.recv(4096)

    t = threading.Thread(target=ask, daemon=True)
    try:
        t.start()
        assert entered.wait(30)
        narrowed = parse_policy("allowlist", [listed])
        grants["pod-a"] = Grant(narrowed, "ten-1", "ses-r", "i")
        for _ in range(600):  # until a sweep has read the narrowed policy for the pod
            if p._boxes["pod-a"].policy == narrowed:  # noqa: SLF001
                break
            threading.Event().wait(0.05)
        assert p._boxes["pod-a"].policy == narrowed  # noqa: SLF001
        release.set()
        t.join(30)
        assert got["answer"].startswith(b"HTTP/1.1 403 ") and NARROWED_PENDING.encode() in got["answer"], got
        recs = audited(lambda r: r.host == "slow.test", box="pod-a")
        assert [(r.decision, r.reason) for r in recs if r.host == "slow.test"] == [("denied", NARROWED_PENDING)]
    finally:
        release.set()
        p.stop()
