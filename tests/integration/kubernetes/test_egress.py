"""Kubernetes boxes reach the network only through the egress gateway's proxy, attacked from inside pods.

The fake API server runs pods as containers on Docker's default bridge; the provider serves its
egress proxy on the bridge's host address (what the Service execbox-egress is in a cluster) and
the fake internet (tests/fakenet.py: names under *.<prefix>.test, HTTP and HTTPS) sits behind it.
Code runs in the pods with Python's urllib, which uses the pods' HTTP(S)_PROXY env. The fake API
server enforces no NetworkPolicy, so that non-proxied connections are blocked in a cluster is
proven only by test_manifests.py (the policies' shape), not at runtime here.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.egress import audit
from execbox.errors import ProviderUnavailableError
from tests.conftest import require

from .conftest import pod_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

FETCH = """
import json, ssl, urllib.request
def main(url, cafile=None, proxy=None):
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    handlers = [urllib.request.ProxyHandler({"http": proxy, "https": proxy})] if proxy else []
    handlers.append(urllib.request.HTTPSHandler(context=ctx))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=8) as r:
            return {"ok": True, "status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"ok": False, "status": e.code, "body": e.read().decode()}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
"""


@pytest.fixture(scope="module")
def fakenet():
    from execbox.boxes import netns

    ok, why = netns.available()
    require(ok, f"box networking for the fake internet ({why})")
    from tests import fakenet as fk

    with fk.serving() as fn:
        yield fn


def _bridge_address(docker_engine) -> str:
    config = (docker_engine.networks.get("bridge").attrs.get("IPAM") or {}).get("Config") or [{}]
    return config[0].get("Gateway") or "172.17.0.1"


@pytest.fixture
def egress_provider(k8s_provider_factory, docker_engine, fakenet):
    gw = _bridge_address(docker_engine)
    with socket.socket() as s:  # a free port on the bridge address (the proxy binds it right after)
        s.bind((gw, 0))
        port = s.getsockname()[1]
    allow = [fakenet.name("www"), fakenet.name("meta"), f"{fakenet.name('hostaddr')}:80|8080"]
    return k8s_provider_factory(network="allowlist", network_allow=allow, egress_proxy=f"{gw}:{port}",
                                egress_proxy_listen=f"{gw}:{port}")


def _wait(cond, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def fetch(p, iid, url, **kw):
    r = p.execute_code(iid, FETCH, "python", 30, {"url": url, **kw})
    assert r.exit_code == 0, r
    return r.result


def test_pod_egress_through_the_gateway_proxy(egress_provider, fake_apiserver, fakenet):
    p = egress_provider
    inst = p.create_instance(tenant_id="t-egress", session_id="s-egress")
    iid = inst.instance_id
    assert inst.metadata["network"]["network"] == "allowlist"
    assert p.applied_limits()["network"] == "allowlist"
    pod = pod_of(fake_apiserver, iid)
    name = pod["metadata"]["name"]
    assert pod["metadata"]["labels"][ks.L_EGRESS] == "on"
    assert json.loads(pod["metadata"]["annotations"][ks.A_EGRESS])["network"] == "allowlist"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"].startswith(f"http://{name}:") and env["NO_PROXY"] == "localhost,127.0.0.1,::1"

    www = fakenet.name("www")
    r = fetch(p, iid, f"http://{www}/plain?x=1")
    assert r.get("status") == 200, r
    seen = json.loads(r["body"])
    assert seen["path"] == "/plain?x=1" and not [h for h in seen["headers"] if h.lower().startswith("proxy-")]
    p.write_file(iid, "ca.pem", fakenet.ca_pem)
    r = fetch(p, iid, f"https://{www}/tls", cafile="/workspace/ca.pem")  # CONNECT, TLS end to end
    assert r.get("status") == 200 and json.loads(r["body"])["tls"] is True, r

    # A server the box runs itself is reached directly (NO_PROXY), not refused by the proxy as loopback.
    local = ("import http.server, threading, urllib.request\n"
             "srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\n"
             "threading.Thread(target=srv.serve_forever, daemon=True).start()\n"
             "print(urllib.request.urlopen(f'http://localhost:{srv.server_address[1]}/', timeout=5).status)")
    assert p.execute_code(iid, local, "python", 30).stdout.strip() == "200"
    # Refused: an unlisted name, a literal IP outside the policy, the metadata address (by IP and by an
    # allowed name that resolves to it), a host address (by IP and by an allowed name).
    for url, why in ((f"http://{fakenet.name('other')}/", "is not allowed by the network policy"),
                     (f"http://{fakenet.server_ip}/", "is not in the allow list"),
                     ("http://169.254.169.254/latest/meta-data/", "always-denied range"),
                     (f"http://{fakenet.name('meta')}/", "resolves to a denied address"),
                     (f"http://{fakenet.host_ip}:8080/", "address of the host"),
                     (f"http://{fakenet.name('hostaddr')}:8080/", "address of the host")):
        r = fetch(p, iid, url)
        assert r.get("status") == 403 and why in r["body"], (url, r)
    r = fetch(p, iid, f"https://{fakenet.name('other')}/", cafile="/workspace/ca.pem")
    assert not r["ok"] and "403" in r.get("error", ""), r  # the CONNECT tunnel is refused
    # Bad proxy credentials: 407, whatever the destination.
    bad = env["HTTP_PROXY"].replace(f"{name}:", f"{name}:0", 1)
    r = fetch(p, iid, f"http://{www}/", proxy=bad)
    assert r.get("status") == 407, r

    # A refusal is audited before the box reads it; a tunnel when it closes, so wait for that one.
    _wait(lambda: any(r.host == www and r.port == 443 and r.bytes_down > 0
                      for r in audit.recent(box=name, decision="allowed")), what="the TLS tunnel's record")
    recs = audit.recent(box=name, limit=100)
    allowed = [r for r in recs if r.decision == "allowed"]
    denied = [r for r in recs if r.decision == "denied"]
    authenticated = allowed + [r for r in denied if "credentials" not in r.reason]  # a 407 proves no pod
    assert allowed and all((r.tenant_id, r.session_id) == ("t-egress", "s-egress") for r in authenticated)
    assert any(r.host == www and r.port == 443 and r.bytes_down > 0 for r in allowed), allowed
    assert any(r.ip == "169.254.169.254" for r in denied)
    # a failed login proves no pod: its row is not filed under the name it claimed, which it names
    assert any("credentials" in r.reason and repr(name) in r.reason for r in audit.recent(box="?", limit=1000))

    # Narrowing a live session: the next connection follows it (port 80 gone, 443 kept); on the pod too.
    p.set_network_policy(iid, "allowlist", [f"{www}:443"])
    r = fetch(p, iid, f"http://{www}/")
    assert r.get("status") == 403 and "is not allowed by the network policy" in r["body"], r
    assert fetch(p, iid, f"https://{www}/", cafile="/workspace/ca.pem").get("status") == 200
    assert json.loads(pod_of(fake_apiserver, iid)["metadata"]["annotations"][ks.A_EGRESS])["allow"] == [f"{www}:443"]
    # network=none for one run: refused, and the label that opens the path to the proxy is off meanwhile.
    with p.network_for_run(iid, "none"):
        assert pod_of(fake_apiserver, iid)["metadata"]["labels"][ks.L_EGRESS] == "off"
        r = fetch(p, iid, f"https://{www}/", cafile="/workspace/ca.pem")
        assert not r["ok"] and "403" in r.get("error", ""), r
    assert pod_of(fake_apiserver, iid)["metadata"]["labels"][ks.L_EGRESS] == "on"
    assert fetch(p, iid, f"https://{www}/", cafile="/workspace/ca.pem").get("status") == 200
    assert any("network is none" in r.reason for r in audit.recent(box=name, decision="denied"))


def test_a_pods_proxy_credentials_do_not_work_from_another_pod(egress_provider, fake_apiserver, fakenet):
    """The token is in every pod's env, readable by its code: code in one pod that gets another
    pod's (another session's, another tenant's) must not get that pod's wider policy. The proxy
    takes a pod's credentials only from the pod's own IP (status.podIPs)."""
    p = egress_provider
    own = p.create_instance(tenant_id="t-egress", session_id="s-own").instance_id
    thief = p.create_instance(tenant_id="t-other", session_id="s-thief").instance_id
    p.set_network_policy(thief, "none")  # the fake API server enforces no NetworkPolicy: it still reaches the proxy
    pod = pod_of(fake_apiserver, own)
    name = pod["metadata"]["name"]
    stolen = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}["HTTP_PROXY"]
    www = fakenet.name("www")
    assert fetch(p, own, f"http://{www}/", proxy=stolen).get("status") == 200  # from its own pod: fine
    r = fetch(p, thief, f"http://{www}/")
    assert r.get("status") == 403 and "network is none" in r["body"], r
    for url in (f"http://{www}/", f"https://{www}/"):
        r = fetch(p, thief, url, proxy=stolen)
        assert r.get("status") == 407 or "407" in r.get("error", ""), (url, r)
    assert "not from that box's own address" in fetch(p, thief, f"http://{www}/", proxy=stolen)["body"]
    thief_ip = pod_of(fake_apiserver, thief)["status"]["podIP"]
    rows = [r for r in audit.recent(box="?", limit=1000) if repr(name) in r.reason and thief_ip in r.reason]
    assert rows and all(r.decision == "denied" and r.tenant_id is None for r in rows)  # not filed under the pod


def test_another_replica_sees_the_pods_policy(egress_provider, k8s_provider_factory, fake_apiserver, fakenet):
    """Replicas are stateless: a second one (no proxy of its own) adopts the session with its policy
    from the pod and narrows it; the first replica's proxy, which still serves the pod, follows
    within its cache TTL."""
    from execbox.providers.kubernetes_egress import EGRESS_TTL

    p1 = egress_provider
    iid = p1.create_instance(tenant_id="t-egress", session_id="s-replica").instance_id
    www = fakenet.name("www")
    assert fetch(p1, iid, f"http://{www}/").get("status") == 200
    p2 = k8s_provider_factory(network="allowlist", network_allow=p1.config["network_allow"],
                              egress_proxy=p1.config["egress_proxy"], egress_proxy_listen="")
    assert p2.proxy is None and p2.effective_network(iid) == p1.effective_network(iid)
    # A narrowing the pod cannot store (RBAC, API down) fails and changes nothing: others would miss it.
    fake_apiserver.forbidden.add(("patch", "pods"))
    before = p2.effective_network(iid)
    with pytest.raises(ProviderUnavailableError) as e:
        p2.set_network_policy(iid, "none")
    assert e.value.code == "SB009" and p2.effective_network(iid) == before
    fake_apiserver.forbidden.clear()
    p2.set_network_policy(iid, "allowlist", [f"{www}:443"])
    time.sleep(EGRESS_TTL + 0.2)
    r = fetch(p2, iid, f"http://{www}/")  # p2 holds the agent connection now; p1's proxy serves the pod
    assert r.get("status") == 403 and "is not allowed by the network policy" in r["body"], r


def test_warm_pod_has_no_egress_and_credentials_are_refused(k8s_provider_factory, egress_provider, fake_apiserver,
                                                             fakenet):
    from execbox.errors import InvalidConfigError

    p = egress_provider
    box = p.start_box()  # a warm pod: it has the proxy env, but no claim and no policy
    try:
        code = FETCH + f"\nprint(main('http://{fakenet.name('www')}/'))"
        r = box.client.call("exec", {"language": "python", "code": code, "timeout": 20, "output_cap": 65536,
                                     "stream": False, "inline_artifacts": False})
        assert "'status': 403" in r["stdout"] and "network is none" in r["stdout"], r
    finally:
        box.destroy()
    # A provider rebuilt on a config change starts while the old one still serves: same proxy address.
    rebuilt = k8s_provider_factory(**{k: p.config[k] for k in ("network", "network_allow", "egress_proxy",
                                                               "egress_proxy_listen")})
    assert rebuilt.proxy is p.proxy and p.proxy is not None
    with pytest.raises(InvalidConfigError) as e:
        k8s_provider_factory(network="allowlist", network_allow=[fakenet.name("www")],
                             egress_proxy=p.config["egress_proxy"], egress_proxy_listen="",
                             network_credentials=json.dumps({fakenet.name("www"): {"Authorization": "Bearer s3cret"}}))
    assert e.value.code == "SB002" and e.value.details["field"] == "network_credentials"
    assert "s3cret" not in e.value.message


def test_service_session_policy_and_audit_api(egress_provider, fakenet):
    """Through the HTTP service: a session's pod goes out, narrowing it (PUT .../network) and a run's
    own `network` take effect on the pod, and the admin audit API lists the attempts."""
    from tests.integration.service.conftest import start_service

    svc = start_service(egress_provider)
    www = fakenet.name("www")

    def run(extra=None):
        r = svc.a.post("/v1/sandbox/execute", json={"code": FETCH, "session_id": "kn1", "timeout": 30,
                                                    "arguments": {"url": f"http://{www}/svc"}, **(extra or {})})
        assert r.status_code == 200, r.text
        return r.json()

    try:
        out = run()
        assert out["result"]["status"] == 200 and out["metadata"]["network"]["network"] == "allowlist", out
        out = run({"network": {"network": "none"}})
        assert out["result"]["status"] == 403 and "network is none" in out["result"]["body"], out
        r = svc.a.put("/v1/sandbox/sessions/tenant-a/kn1/network", json={"network": "open"})
        assert r.status_code == 403  # wider than the provider's policy
        r = svc.a.put("/v1/sandbox/sessions/tenant-a/kn1/network",
                      json={"network": "allowlist", "allow": [f"{www}:443"]})
        assert r.status_code == 200, r.text
        out = run()
        assert out["result"]["status"] == 403 and "is not allowed by the network policy" in out["result"]["body"]
        deadline = time.monotonic() + 5
        while True:
            rows = svc.root.get("/api/admin/egress/audit", params={"tenant_id": "tenant-a", "session_id": "kn1"}
                                ).json()["data"]
            if len(rows) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [x["decision"] for x in rows][:3] == ["denied", "denied", "allowed"], rows
        assert all(x["box"].startswith("execbox-default-") and x["host"] == www for x in rows[:3])
    finally:  # a stop would leave the session's pod for the next start (kubernetes_handover.py)
        svc.root.delete("/v1/sandbox/sessions/tenant-a/kn1")
        svc.stop()
