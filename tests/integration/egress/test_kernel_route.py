"""The kernel route (boxes/netroute.py): IP allow entries leave a jail box through the host's
forwarding path. Attacked from inside the box: it must reach exactly what the entries list and
be audited like the gateway's connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import require

from .conftest import audited, jail_with
from .test_jail_egress import NODE_FETCH, PY_FETCH

ROUTED = "kernel route (IP allow entry)"


@pytest.fixture(scope="module")
def rjail(fakenet):
    from execbox.boxes import netroute

    ok, why = netroute.available()
    require(ok, f"the kernel route ({why})")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80", "203.0.113.0/24:8080", fakenet.name("www")])
    yield p
    p.shutdown()


def _link(p, iid):
    return p._get(iid).box.net.link


def py(p, iid, url):
    r = p.execute_code(iid, PY_FETCH, "python", 30, {"url": url})
    assert r.exit_code == 0, r
    return r.result


def _iptables_save() -> str:
    return subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, check=True).stdout


def test_ip_entry_is_routed_and_audited(rjail, fakenet, node_available):
    iid = rjail.create_instance(session_id="kroute").instance_id
    try:
        assert _link(rjail, iid).conntrack is not None  # the box has a kernel route
        r = py(rjail, iid, f"http://{fakenet.server_ip}/bytes/200000")
        assert r.get("status") == 200 and len(r["body"]) == 200000, r
        r = rjail.run_command(iid, f"curl -s -o /dev/null -w '%{{http_code}}' http://{fakenet.server_ip}/curl", 30)
        assert r.stdout == "200", r
        if node_available:
            r = rjail.execute_code(iid, NODE_FETCH, "javascript", 30, {"url": f"http://{fakenet.server_ip}/node"})
            assert r.result.get("status") == 200 and json.loads(r.result["body"])["path"] == "/node", r
        # a hostname entry still goes through the gateway, in the same box
        r = py(rjail, iid, f"http://{fakenet.name('www')}/named")
        assert r.get("status") == 200, r
        audited(lambda x: x.host == fakenet.name("www"), session_id="kroute")
        recs = audited(lambda x: x.bytes_down >= 200000, session_id="kroute")
        routed = [x for x in recs if x.reason == ROUTED]
        assert any(x.bytes_down >= 200000 and x.bytes_up > 0 and x.ip == fakenet.server_ip and x.port == 80
                   for x in routed), recs
        assert all(x.tenant_id and x.box for x in routed)
        assert any(x.host == fakenet.name("www") and x.reason != ROUTED for x in recs), recs
    finally:
        rjail.destroy_instance(iid)


def test_routed_cidr_never_reaches_the_host_other_ports_or_boxes(rjail, fakenet):
    a = rjail.create_instance(session_id="kroute-attack").instance_id
    b = rjail.create_instance().instance_id
    try:
        b_addr = str(rjail._get(b).box.net.net.route.addr)
        code = f"""
import socket
out = {{}}
for ip, port in (("{fakenet.host_ip}", 8080), ("{fakenet.host_ip}", 80), ("{fakenet.server_ip}", 8080),
                 ("{b_addr}", 8000), ("169.254.169.254", 80), ("10.0.0.1", 80)):
    try:
        s = socket.create_connection((ip, port), timeout=3)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        out[f"{{ip}}:{{port}}"] = s.recv(200).decode(errors="replace")[:60]
    except Exception as e:
        out[f"{{ip}}:{{port}}"] = type(e).__name__
print(out)
"""
        assert rjail.execute_code(b, "import socket; s = socket.socket(); s.bind(('0.0.0.0', 8000)); s.listen()\n"
                                  "print('up')", "python", 10, context_id="srv").stdout == "up\n"
        got = eval(rjail.execute_code(a, code, "python", 60).stdout)  # noqa: S307 - our own dict repr
        # the host's own address inside the listed /24: refused by the host at once, on any port
        assert got[f"{fakenet.host_ip}:8080"] == "ConnectionRefusedError", got
        # port 80 of the /24 is not listed (only the server's /32 is): the gateway refuses it
        assert "403" in got[f"{fakenet.host_ip}:80"], got
        # listed /24:8080 but nothing listens there: the server's own refusal (the route works)
        assert got[f"{fakenet.server_ip}:8080"] == "ConnectionRefusedError", got
        for k in (f"{b_addr}:8000", "169.254.169.254:80", "10.0.0.1:80"):
            assert "403" in got[k], (k, got)  # never routed: the gateway refuses (always-denied ranges)
        recs = audited(lambda x: x.decision == "denied" and x.ip == fakenet.host_ip, session_id="kroute-attack")
        assert any(x.ip == fakenet.host_ip and x.port == 8080 and x.decision == "denied"
                   and "address of the host" in x.reason for x in recs), recs
    finally:
        rjail.destroy_instance(a)
        rjail.destroy_instance(b)


def test_narrowing_removes_the_route_and_cuts_open_connections(rjail, fakenet):
    iid = rjail.create_instance(session_id="kroute-narrow").instance_id
    try:
        chain = _link(rjail, iid)
        route = rjail._get(iid).box.net.net.route
        hold = f"""
import socket
s = socket.create_connection(("{fakenet.server_ip}", 80), timeout=5)
f = s.makefile("rb")
def ask(path):  # one whole keep-alive exchange: status line, headers, body
    s.sendall(f"GET {{path}} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
    status, size = f.readline().decode().strip(), 0
    while (line := f.readline()) not in (b"\\r\\n", b""):
        if line.lower().startswith(b"content-length:"):
            size = int(line.split(b":")[1])
    f.read(size)
    return status
print(ask("/one"))
"""
        assert rjail.execute_code(iid, hold, "python", 20, context_id="c").stdout == "HTTP/1.1 200 OK\n"
        assert f"-d {fakenet.server_ip}/32" in _iptables_save()
        # still a routed entry left (the /24 on 8080), so the route stays and only its rules change
        rjail.set_network_policy(iid, "allowlist", ["203.0.113.0/24:8080", fakenet.name("www")])
        assert f"-d {fakenet.server_ip}/32" not in _iptables_save().split(f":{route.chain}")[1]
        again = """
try:
    print(repr(ask("/two")))
except Exception as e:
    print(type(e).__name__)
"""
        out = rjail.execute_code(iid, again, "python", 20, context_id="c").stdout
        assert "200 OK" not in out, out  # the open connection is cut (reset), not carried on
        r = py(rjail, iid, f"http://{fakenet.server_ip}/three")
        assert r.get("status") == 403, r  # a new one meets the gateway, which refuses it
        assert chain.policy.to_dict()["allow"] == ["203.0.113.0/24:8080", f"{fakenet.name('www')}:80|443"]
    finally:
        rjail.destroy_instance(iid)


# a server in the fake internet that talks first and keeps talking: one tick every 0.2 s
TICKER = r"""
import json, socket, sys, threading, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); print("ready", flush=True)
srv.settimeout(20); c, _ = srv.accept(); srv.close()
got, err = [], []
def read():
    try:
        while d := c.recv(4096):
            got.extend((time.time(), x) for x in d.decode().split())
    except OSError as e:
        err.append(type(e).__name__)
threading.Thread(target=read, daemon=True).start()
end = time.time() + 8
try:
    while time.time() < end:
        c.sendall(b"tick\n"); time.sleep(0.2)
except OSError as e:
    err.append(type(e).__name__)
time.sleep(0.3)
print(json.dumps({"got": got, "err": err}), flush=True)
"""

# the box answers each tick; after 0.5 s of silence it speaks up itself
ANSWER = """
import json, socket, time
s = socket.create_connection(("{ip}", {port}), timeout=5); s.settimeout(0.5)
got, err, end = [], None, time.time() + 8
while time.time() < end and err is None:
    try:
        if not s.recv(100):
            err = ("EOF", time.time())
        else:
            got.append(time.time()); s.sendall(b"ack\\n")
    except TimeoutError:
        try:
            s.sendall(b"probe\\n")
        except OSError as e:
            err = (type(e).__name__, time.time())
    except OSError as e:
        err = (type(e).__name__, time.time())
print(json.dumps({{"got": got, "err": err}}))
"""


def test_narrowing_cuts_a_routed_connection_the_remote_side_keeps_talking_on(rjail, fakenet):
    """The server sends the next packet after the narrowing: its connection must not be picked up
    again (in either namespace) and carried on; both sides are cut at once and nothing flows."""
    from execbox.egress import conntrack

    srv = subprocess.Popen(["ip", "netns", "exec", fakenet.prefix, sys.executable, "-c", TICKER,
                            fakenet.server_ip, "8080"], stdout=subprocess.PIPE, text=True)
    iid = rjail.create_instance(session_id="kroute-remote").instance_id
    try:
        assert srv.stdout.readline().strip() == "ready"
        narrowed: list[float] = []

        def narrow() -> None:
            time.sleep(1.5)
            rjail.set_network_policy(iid, "allowlist", [f"{fakenet.server_ip}:80", fakenet.name("www")])
            narrowed.append(time.time())

        t = threading.Thread(target=narrow)
        t.start()
        r = rjail.execute_code(iid, ANSWER.format(ip=fakenet.server_ip, port=8080), "python", 30)
        t.join()
        box = json.loads(r.stdout)
        server = json.loads(srv.communicate(timeout=15)[0])
        after = narrowed[0] + 0.3  # packets already in flight when the narrowing returned
        acks_before = [w for ts, w in server["got"] if ts < narrowed[0] and w == "ack"]
        assert len(acks_before) >= 3 and len(box["got"]) >= 3, (box, server)  # it was routed and worked
        assert [x for x in box["got"] if x > after] == [], (narrowed, box)  # nothing more reaches the box
        assert [x for x in server["got"] if x[0] > after] == [], (narrowed, server)  # nor leaves it
        # the box learns at once (a reset when it speaks up), it is not left to its timeout
        assert box["err"] is not None and box["err"][0] == "ConnectionResetError", box
        assert box["err"][1] - narrowed[0] < 2, (narrowed, box)
        # the host forgot the connection too (its state would let established packets pass)
        sock = conntrack.query_socket()
        try:
            host = conntrack.entries(sock, src=str(rjail._get(iid).box.net.net.route.addr))
        finally:
            sock.close()
        assert [e for e in host if e[3] == 8080] == [], host
        recs = audited(lambda x: x.port == 8080 and x.bytes_down > 0, session_id="kroute-remote")
        assert any(x.port == 8080 and x.reason == ROUTED and x.bytes_down > 0 for x in recs), recs
    finally:
        srv.kill()
        srv.wait()
        rjail.destroy_instance(iid)


def _top(table: str, chain: str, n: int) -> list[str]:
    out = subprocess.run(["iptables", "-w", "-t", table, "-S", chain], capture_output=True, text=True,
                         check=True).stdout
    return [x for x in out.splitlines() if x.startswith("-A ")][:n]


def test_a_new_box_puts_the_host_rules_back_at_the_top(rjail, fakenet):
    """Docker (re)started after execbox puts its own FORWARD rules first; a box set up after that
    must find execbox's jumps first again (and the INPUT refusal of box packets)."""
    dummy = ["-s", "192.0.2.1/32", "-d", "192.0.2.2/32", "-m", "comment", "--comment", "exb-test-top", "-j", "ACCEPT"]
    for chain in ("FORWARD", "INPUT"):
        subprocess.run(["iptables", "-w", "-I", chain, "1", *dummy], check=True)
    try:
        assert "exb-test-top" in _top("filter", "FORWARD", 1)[0]
        iid = rjail.create_instance().instance_id
        try:
            assert _top("filter", "FORWARD", 2) == ["-A FORWARD -i exh+ -j EXB-FWD", "-A FORWARD -o exh+ -j EXB-FWD"]
            assert _top("filter", "INPUT", 2) == ["-A INPUT -i exh+ -p tcp -j REJECT --reject-with tcp-reset",
                                                  "-A INPUT -i exh+ -j DROP"]
            assert _top("nat", "PREROUTING", 1) == ["-A PREROUTING -i exh+ -j RETURN"]
            assert py(rjail, iid, f"http://{fakenet.server_ip}/top").get("status") == 200
        finally:
            rjail.destroy_instance(iid)
        rules = _iptables_save()
        assert rules.count("-A FORWARD -i exh+ -j EXB-FWD") == 1 and rules.count("-A INPUT -i exh+ -j DROP") == 1
    finally:
        for chain in ("FORWARD", "INPUT"):
            subprocess.run(["iptables", "-w", "-D", chain, *dummy], check=False)


def test_caps_are_shared_by_the_gateway_and_the_route(fakenet, monkeypatch):
    """One byte cap and one connection cap per box, whichever path its connections take."""
    from execbox.boxes import netroute

    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_BYTES", str(3_000_000))
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_CONNECTIONS", "4")
    www = fakenet.name("www")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80", www])
    try:
        a = p.create_instance(session_id="kroute-shared").instance_id
        assert _link(p, a).conntrack is not None
        r = p.execute_code(a, f"""
import socket
def dl(ip, host, n):
    s = socket.create_connection((ip, 80), timeout=10)
    s.sendall(f"GET /bytes/{{n}} HTTP/1.1\\r\\nHost: {{host}}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    got = 0
    try:
        while c := s.recv(1 << 16):
            got += len(c)
    except OSError as e:
        return f"{{got}} {{type(e).__name__}}"
    return f"{{got}} ok"
print(dl(socket.gethostbyname("{www}"), "{www}", 2_000_000))
print(dl("{fakenet.server_ip}", "x", 2_000_000))
""", "python", 60)
        via_gw, via_route = r.stdout.split("\n")[:2]
        assert via_gw.endswith(" ok") and int(via_gw.split()[0]) > 2_000_000, r
        got, how = via_route.split()
        # 3 MB in all, not 3 MB a path: cut after about 1 MB (and what was already in flight then)
        assert how == "ConnectionResetError" and int(got) < 2_000_000, r
        recs = audited(lambda x: x.decision == "limited", session_id="kroute-shared")
        assert any(x.decision == "limited" and ROUTED in x.reason for x in recs), recs

        b = p.create_instance().instance_id
        r = p.execute_code(b, f"""
import socket
w = socket.gethostbyname("{www}")
held, res = [], []
for ip in [w] * 3 + ["{fakenet.server_ip}"] * 3:
    try:
        s = socket.create_connection((ip, 80), timeout=5)
        s.sendall(b"GET /bytes/1 HTTP/1.1\\r\\nHost: {www}\\r\\n\\r\\n"); s.settimeout(3)
        res.append(s.recv(12).decode()); held.append(s)
    except OSError as e:
        res.append(type(e).__name__)
print(res)
""", "python", 60)
        res = eval(r.stdout)  # noqa: S307 - our own list repr
        assert res[:4] == ["HTTP/1.1 200"] * 4, r  # 3 through the gateway, 1 routed
        assert res[4:] == ["HTTP/1.1 403"] * 2, r  # 4 open in all: the cap; the gateway refuses the rest
        recs = audited(lambda x: "too many concurrent connections" in x.reason and x.ip == fakenet.server_ip,
                       decision="denied")
        assert sum("too many concurrent connections (cap 4)" in x.reason and x.ip == fakenet.server_ip
                   for x in recs) >= 2, recs  # refused at the cap, and on record with where they went
    finally:
        p.shutdown()


def test_caps_hold_on_the_kernel_route(fakenet, monkeypatch):
    from execbox.boxes import netroute

    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_BYTES", str(2 * 1024 * 1024))
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_CONNECTIONS", "2")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80"])
    try:
        iid = p.create_instance(session_id="kroute-caps").instance_id
        r = p.execute_code(iid, f"""
import socket, time, urllib.request
held = [socket.create_connection(("{fakenet.server_ip}", 80), timeout=5) for _ in range(2)]
try:
    urllib.request.urlopen("http://{fakenet.server_ip}/third", timeout=5); print("third ok")
except Exception as e:
    print("third refused", e)
for s in held: s.close()
time.sleep(1)  # the two closed connections leave the connection count
def tcp():
    lines = open("/proc/net/netstat").read().splitlines()
    pairs = (zip(lines[i].split()[1:], lines[i + 1].split()[1:]) for i in range(0, len(lines), 2))
    return {{k: int(v) for pair in pairs for k, v in pair}}
before, t0 = tcp(), time.monotonic()
try:
    n = len(urllib.request.urlopen("http://{fakenet.server_ip}/bytes/{8 * 1024 * 1024}", timeout=10).read())
    print("downloaded", n)
except Exception as e:
    print("cut", type(e).__name__)
after = tcp()
took = round(time.monotonic() - t0, 3)
print("tcp", took, {{k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}})
""", "python", 60)
        assert "third refused" in r.stdout and "403" in r.stdout, r  # the gateway refuses it (audited)
        # cut with a reset at the cap, not left to stall until the client's timeout (a CI run once
        # saw TimeoutError here, not reproduced since: the message carries what would explain it)
        if "cut ConnectionResetError" not in r.stdout:  # pytest.fail: an assertion's message is cut short
            pytest.fail(f"not cut with a reset:\n{r.stdout}\n{_cut_counters(p, iid)}")
        recs = audited(lambda x: x.decision == "limited", session_id="kroute-caps")
        assert any(x.decision == "limited" and "byte cap" in x.reason for x in recs), recs
    finally:
        p.shutdown()


def _cut_counters(p, iid) -> str:
    """The box namespace's and the host's rule counters, for a cut that did not end in a reset."""
    net = p._get(iid).box.net.net
    ns = subprocess.run(["ip", "netns", "exec", net.name, "iptables", "-w", "-S", "-v"], capture_output=True, text=True)
    host = subprocess.run(["iptables", "-w", "-S", "-v"], capture_output=True, text=True)
    return "\n".join([ns.stdout, ns.stderr, *(line for line in host.stdout.splitlines() if net.route.chain in line)])


def test_connections_after_the_byte_quota_is_spent_are_refused_on_record(fakenet, monkeypatch):
    """Once the quota is spent, a new connection (routed or through the gateway) is refused by
    the gateway and audited with where it went, not reset in the namespace without a record."""
    from execbox.boxes import netroute

    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    monkeypatch.setenv("EXECBOX_EGRESS_MAX_BYTES", str(1024 * 1024))
    www = fakenet.name("www")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80", www])
    try:
        iid = p.create_instance(session_id="kroute-spent").instance_id
        r = p.execute_code(iid, f"""
import socket, urllib.request
try:
    urllib.request.urlopen("http://{fakenet.server_ip}/bytes/{4 * 1024 * 1024}", timeout=10).read()
    print("downloaded")
except Exception as e:
    print("cut", type(e).__name__)
for ip, host in (("{fakenet.server_ip}", "x"), (socket.gethostbyname("{www}"), "{www}")):
    try:
        s = socket.create_connection((ip, 80), timeout=5)
        s.sendall(f"GET /bytes/1 HTTP/1.1\\r\\nHost: {{host}}\\r\\n\\r\\n".encode()); s.settimeout(5)
        print("after", s.recv(200).decode().split("\\r\\n")[0])
    except OSError as e:
        print("after", type(e).__name__)
""", "python", 60)
        lines = r.stdout.splitlines()
        assert lines[0] == "cut ConnectionResetError", r
        assert lines[1:] == ["after HTTP/1.1 403 Forbidden"] * 2, r  # the gateway's refusal, both paths
        recs = audited(lambda x: "byte cap of 1048576 reached for this box" in x.reason, session_id="kroute-spent")
        spent = [x for x in recs if "byte cap of 1048576 reached for this box" in x.reason]
        assert {x.decision for x in spent} == {"denied"}, recs
        assert {x.ip for x in spent} >= {fakenet.server_ip}, recs  # with the destination it asked for
        assert len(spent) >= 2, recs
    finally:
        p.shutdown()


def test_route_off_means_the_gateway_and_nothing_is_left_behind(fakenet, monkeypatch):
    from execbox.boxes import netroute

    monkeypatch.setenv("EXECBOX_EGRESS_KERNEL_ROUTE", "0")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80"])
    try:
        iid = p.create_instance(session_id="kroute-off").instance_id
        assert _link(p, iid).conntrack is None
        r = py(p, iid, f"http://{fakenet.server_ip}/viagw")
        assert r.get("status") == 200, r
        recs = audited(lambda x: x.decision == "allowed", session_id="kroute-off")
        assert recs and all(x.reason != ROUTED for x in recs), recs
    finally:
        p.shutdown()
    monkeypatch.delenv("EXECBOX_EGRESS_KERNEL_ROUTE")
    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80"])
    iid = p.create_instance().instance_id
    route = p._get(iid).box.net.net.route
    assert route is not None and route.chain in _iptables_save()
    p.shutdown()
    assert f":{route.chain} " not in _iptables_save()
    assert not os.path.exists(f"/sys/class/net/{route.ifname}")


def dead_process_chain() -> str:
    """A route chain, jumped to from the dispatch chain, named for a process that does not exist."""
    from execbox.boxes import netroute

    require(os.geteuid() == 0, "root (iptables)")
    dead = 4194000  # above any pid this machine hands out (pid_max is 4194304 at most)
    while os.path.exists(f"/proc/{dead}"):
        dead += 1
    chain = f"{netroute.CHAIN_PREFIX}{dead:x}-1"
    netroute._ensure_base()
    subprocess.run(["iptables", "-w", "-N", chain], check=True)
    subprocess.run(["iptables", "-w", "-I", netroute.DISPATCH, "1", "-i", f"exh{dead:x}-1", "-j", chain], check=True)
    return chain


def test_chains_of_a_dead_process_are_reaped():
    from execbox.boxes import netroute

    chain = dead_process_chain()
    assert chain in netroute.reap_stale()
    assert f":{chain} " not in _iptables_save()
