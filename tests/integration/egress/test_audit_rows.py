"""Audit rows a box can make come in bounded numbers and say what happened, and an operator's /32
of a host address means the same with or without the kernel route (found by review 48)."""

from __future__ import annotations

import http.server
import threading
import time

from tests.conftest import require

from .conftest import audited, jail_with
from .test_jail_egress import PY_FETCH


def _link(p, iid):
    from execbox.providers.agent_egress import egress_link

    return egress_link(p._get(iid).box)


def test_failed_upstream_connects_get_bounded_rows_and_exact_counts(fakenet):
    """Under ``open`` a box can dial a closed port of a public address thousands of times a
    second; each was an allowed row ("upstream connect failed"), pushing other tenants' rows out."""
    from execbox.egress import audit

    p = jail_with("open")
    try:
        iid = p.create_instance(session_id="connect-flood").instance_id
        link = _link(p, iid)
        link.connections.clock = lambda: 100.0  # one second, however slow this machine is
        before = audit.counts().get(("tcp", "allowed"), 0)
        r = p.execute_code(iid, f"""
import socket
for _ in range(300):
    try:
        socket.create_connection(("{fakenet.server_ip}", 81), timeout=5).recv(1)
    except OSError:
        pass
""", "python", 120)
        assert r.exit_code == 0, r
        deadline = time.monotonic() + 20  # each is counted when its handler ends
        while audit.counts().get(("tcp", "allowed"), 0) - before < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        per = link.connections.per_second
    finally:
        p.shutdown()  # the box goes: what its budget held back is summed up
    recs = audit.recent(session_id="connect-flood", limit=10000)
    own = [x for x in recs if x.port == 81]
    summed = [int(x.reason.split()[0]) for x in recs if "more connections allowed within one second" in x.reason]
    assert audit.counts()[("tcp", "allowed")] - before == 300  # the metrics count every one
    assert len(own) == per and all("upstream connect failed" in x.reason for x in own), own[:3]
    assert summed == [300 - per]


def test_a_box_dialling_the_gateway_s_cap_listeners_itself_gets_a_truthful_row(fakenet):
    """A routed box's cap listeners sit on its own loopback (127.0.0.1:15002/15003); a connection
    the box makes to them directly was recorded as if a cap had been reached."""
    from execbox.boxes import netroute

    ok, why = netroute.available()
    require(ok, f"the kernel route ({why})")
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80"])
    try:
        iid = p.create_instance(session_id="cap-listeners").instance_id
        assert _link(p, iid).conntrack is not None  # routed: it has the cap listeners
        r = p.execute_code(iid, """
import socket
for port in (15002, 15003):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).recv(1)
    except OSError:
        pass
""", "python", 60)
        assert r.exit_code == 0, r
        recs = audited(lambda x: x.port == 15003, session_id="cap-listeners")
        rows = sorted((x.ip, x.port, x.decision, x.reason) for x in recs if x.port in (15002, 15003))
        assert rows == [("127.0.0.1", port, "denied", f"127.0.0.1:{port} is the gateway's own listener, not a "
                                                       "destination") for port in (15002, 15003)], rows
    finally:
        p.shutdown()


def test_an_operator_s_slash_32_of_a_host_address_is_reached_with_the_route_on(fakenet):
    """The gateway lets an operator's exact /32 reach an address of the host; the kernel route
    would have carried it to the host's firewall, which refuses every routed packet for the host."""
    from execbox.boxes import netroute

    ok, why = netroute.available()
    require(ok, f"the kernel route ({why})")

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *a):  # noqa: ANN002
            pass

    srv = http.server.ThreadingHTTPServer((fakenet.host_ip, 0), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    p = jail_with("allowlist", [f"{fakenet.server_ip}:80", f"{fakenet.host_ip}/32:{port}"])
    try:
        iid = p.create_instance(session_id="host-slash32").instance_id
        assert _link(p, iid).conntrack is not None  # the box has a route (for the server's entry)
        r = p.execute_code(iid, PY_FETCH, "python", 30, {"url": f"http://{fakenet.host_ip}:{port}/"})
        assert r.result.get("status") == 200 and r.result["body"] == "hello", r
        recs = audited(lambda x: x.port == port, session_id="host-slash32")
        assert any(x.ip == fakenet.host_ip and x.decision == "allowed" and x.reason == "explicit cidr"
                   for x in recs), recs
    finally:
        p.shutdown()
        srv.shutdown()
