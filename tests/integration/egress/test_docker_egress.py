"""Docker boxes (runc and runsc) behind the egress gateway, attacked from Python and Node."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require

from .test_jail_egress import NODE_FETCH, PY_FETCH


@pytest.fixture(scope="module", params=["runc", "runsc"])
def dprov(request, fakenet, docker_engine):
    from execbox.providers.docker import DockerProvider

    runtimes = docker_engine.info().get("Runtimes") or {}
    if request.param == "runsc":
        require("runsc-net" in runtimes, "the runsc-net Docker runtime (scripts/setup/test/45-runsc-net.sh)")
    p = DockerProvider()
    p.initialize({"runtime": request.param, "pool_size": 0, "preload": "none", "network": "allowlist",
                  "network_allow": [fakenet.name("www"), fakenet.name("rebind")]})
    yield p
    p.shutdown()


def py(p, iid, url, cafile=None):
    r = p.execute_code(iid, PY_FETCH, "python", 30, {"url": url, "cafile": cafile})
    assert r.exit_code == 0, r
    return r.result


def test_docker_egress_policy(dprov, fakenet):
    inst = dprov.create_instance(session_id="egress-d")
    iid = inst.instance_id
    try:
        assert inst.metadata["network"]["network"] == "allowlist"
        dprov.write_file(iid, "ca.pem", fakenet.ca_pem)
        www = fakenet.name("www")
        r = py(dprov, iid, f"http://{www}/d")
        assert r.get("status") == 200 and json.loads(r["body"])["path"] == "/d", r
        r = py(dprov, iid, f"https://{www}/tls", "/workspace/ca.pem")
        assert r.get("status") == 200 and json.loads(r["body"])["tls"] is True, r
        r = dprov.execute_code(iid, NODE_FETCH, "javascript", 30, {"url": f"http://{www}/node"})
        assert r.result.get("status") == 200, r
        # bash (the image has no curl): plain HTTP over /dev/tcp. runc only: under gVisor's host network
        # stack a blocking read of bash's /dev/tcp fd can fail with EAGAIN (a runsc quirk, not policy)
        get = 'exec 3<>/dev/tcp/{h}/80 && printf "GET / HTTP/1.0\\r\\nHost: {h}\\r\\n\\r\\n" >&3 && head -1 <&3'
        if dprov.runtime == "runc":
            r = dprov.run_command(iid, get.format(h=www), 30)
            assert r.stdout.startswith("HTTP/1.1 200"), r
            r = dprov.run_command(iid, get.format(h=fakenet.server_ip), 30)
            assert r.stdout.startswith("HTTP/1.1 403"), r
        r = py(dprov, iid, f"http://{fakenet.name('other')}/")
        assert not r["ok"] and "Name or service not known" in r.get("error", ""), r
        for url in (f"http://{fakenet.server_ip}/", "http://169.254.169.254/", f"http://{fakenet.name('rebind')}/",
                    f"http://{fakenet.host_ip}:8080/", "http://172.17.0.1/", "http://10.0.0.1/"):
            r = py(dprov, iid, url)
            assert r.get("status") == 403, (url, r)
        code = """
import socket
out = {}
for name, fam, addr in (("v6", socket.AF_INET6, ("2001:db8::1", 80)), ("v6loop", socket.AF_INET6, ("::1", 80))):
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(3)
    try: s.connect(addr); out[name] = "connected"
    except OSError as e: out[name] = str(e)
try: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); out["raw"] = "created"
except OSError as e: out["raw"] = str(e)
print(out)
"""
        r = dprov.execute_code(iid, code, "python", 30)
        assert "connected" not in r.stdout and "created" not in r.stdout, r
        dprov.set_network_policy(iid, "none")
        r = py(dprov, iid, f"http://{www}/")
        assert not r["ok"], r
    finally:
        dprov.destroy_instance(iid)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_docker_ip_entry_takes_the_kernel_route(runtime, fakenet, docker_engine):
    """An IP allow entry: the container's namespace routes it through the host (boxes/netroute.py),
    audited from its conntrack; the host's own address in a listed range stays refused."""
    from execbox.boxes import netroute
    from execbox.providers.docker import DockerProvider

    from .conftest import audited

    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    if runtime == "runsc":
        require("runsc-net" in (docker_engine.info().get("Runtimes") or {}), "the runsc-net Docker runtime")
    p = DockerProvider()
    p.initialize({"runtime": runtime, "pool_size": 0, "preload": "none", "network": "allowlist",
                  "network_allow": [f"{fakenet.server_ip}:80", "203.0.113.0/24:8080"]})
    try:
        iid = p.create_instance(session_id=f"kroute-{runtime}").instance_id
        r = py(p, iid, f"http://{fakenet.server_ip}/bytes/100000")
        assert r.get("status") == 200 and len(r["body"]) == 100000, r
        r = py(p, iid, f"http://{fakenet.host_ip}:8080/")
        assert not r["ok"] and "refused" in r.get("error", "").lower(), r
        recs = audited(lambda x: x.bytes_down >= 100000, session_id=f"kroute-{runtime}")
        assert any(x.reason == "kernel route (IP allow entry)" and x.ip == fakenet.server_ip for x in recs), recs
    finally:
        p.shutdown()


def test_docker_provider_start_reaps_dead_processes_routes(fakenet, docker_engine, monkeypatch):
    """A crashed execbox that ran Docker boxes only leaves route chains too: a Docker provider
    with network removes them when it starts, as the jail provider does."""
    from execbox.boxes import netns, netroute
    from execbox.providers.docker import DockerProvider

    from .test_kernel_route import _iptables_save, dead_process_chain

    require(netroute.available()[0], f"the kernel route ({netroute.available()[1]})")
    chain = dead_process_chain()
    monkeypatch.setattr(netns, "_reaped", False)  # this test process has reaped once already
    p = DockerProvider()
    try:
        p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none", "network": "allowlist",
                      "network_allow": [f"{fakenet.server_ip}:80"]})
        assert f":{chain} " not in _iptables_save()
    finally:
        p.shutdown()
