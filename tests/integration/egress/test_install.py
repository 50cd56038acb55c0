"""In-session install: pip and npm run in the box, through the gateway, index hosts allowed only
for the step; unknown package / unreachable index name what failed; audited."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from execbox.errors import ConnectionFailedError, ExecutionTimeoutError, InvalidConfigError, PayloadTooLargeError
from tests import pkgindex

from .conftest import audited, jail_with
from .wheels import publish_files

PY_FETCH = """
import urllib.request
def main(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except Exception as e:
        return f"{type(e).__name__}: {e}"
"""


@pytest.fixture(scope="module")
def pkgs(fakenet):
    tag = os.getpid()
    names = {"py": f"sesspkg{tag}", "js": f"sessaxios{tag}"}
    pkgindex.publish_wheel(fakenet.pkg_root, names["py"], "2.0", "def answer():\n    return 42\n")
    pkgindex.publish_npm(fakenet.pkg_root, names["js"], "0.1.0",
                         "module.exports = { get: async (u) => ({ data: 'got ' + u }) };\n")
    host = fakenet.name("pkgs")
    return {**names, "host": host, "pip": f"http://{host}/pkgs/simple", "npm": f"http://{host}/pkgs/npm"}


@pytest.fixture(scope="module")
def net_jail(fakenet):
    p = jail_with("allowlist", [fakenet.name("www")])
    yield p
    p.shutdown()


@pytest.fixture
def sbox(net_jail, pkgs, monkeypatch):
    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", pkgs["pip"])
    monkeypatch.setenv("EXECBOX_NPM_REGISTRY", pkgs["npm"])
    inst = net_jail.create_instance(session_id="install-t")
    yield inst.instance_id
    net_jail.destroy_instance(inst.instance_id)


def test_install_pip_and_npm_through_the_gateway_and_audited(net_jail, sbox, pkgs):
    out = net_jail.install_packages(sbox, pip=[pkgs["py"]], npm=[pkgs["js"]])
    assert out["installed"] and out["bytes"] > 0 and f"{pkgs['host']}:80" in out["allowed_during_install"]
    r = net_jail.execute_code(sbox, f"import {pkgs['py']} as m\nprint(m.answer())", "python", 30)
    assert r.exit_code == 0 and r.stdout.strip() == "42", r
    r = net_jail.execute_code(sbox, f"const ax = require('{pkgs['js']}');\n"
                                    "ax.get('/u').then(r => console.log(r.data));", "javascript", 30)
    assert r.exit_code == 0 and r.stdout.strip() == "got /u", r
    r = net_jail.run_command(sbox, f"python3 -c 'import {pkgs['py']} as m; print(m.answer())'", 30)
    assert r.stdout.strip() == "42", r  # bash's python3 finds it too (PYTHONPATH)
    # the index host was allowed for the step only: afterwards the session's own policy holds
    assert net_jail.effective_network(sbox)["allow"] == [f"{pkgs['host'].replace('pkgs', 'www')}:80|443"]
    r = net_jail.execute_code(sbox, PY_FETCH, "python", 30, {"url": f"{pkgs['pip']}/"})
    assert "Name or service not known" in str(r.result), r
    recs = audited(lambda x: x.run_id == out["egress_run_id"] and x.host == pkgs["host"], session_id="install-t")
    mine = [x for x in recs if x.run_id == out["egress_run_id"]]
    assert mine and all(x.host == pkgs["host"] and x.decision == "allowed" for x in mine)
    assert sum(x.bytes_down for x in mine) > 0


def test_unknown_package_and_unreachable_index_name_what_failed(net_jail, sbox, pkgs, fakenet, monkeypatch):
    with pytest.raises(InvalidConfigError) as e:
        net_jail.install_packages(sbox, pip=["no-such-pkg-zz"])
    assert e.value.code == "SB002" and e.value.http_status == 404 and "no-such-pkg-zz" in e.value.message
    assert e.value.details["index"] == f"http://{pkgs['host']}/…"  # its path may hold a token
    with pytest.raises(InvalidConfigError) as e:
        net_jail.install_packages(sbox, npm=["no-such-npm-zz"])
    assert e.value.http_status == 404 and "no-such-npm-zz" in e.value.message
    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", f"http://{fakenet.name('pkgs')}:8099/simple")  # nothing listens
    with pytest.raises(ConnectionFailedError) as e:
        net_jail.install_packages(sbox, pip=[pkgs["py"]])
    assert e.value.code == "SB003" and f"{fakenet.name('pkgs')}:8099/…" in e.value.message
    with pytest.raises(InvalidConfigError, match="invalid"):
        net_jail.install_packages(sbox, pip=["http://evil.example/x.whl"])
    r = net_jail.run_command(sbox, "ls -A .execbox 2>/dev/null; ls node_modules 2>/dev/null | wc -l", 30)
    assert "install-" not in r.stdout and r.stdout.strip().endswith("0"), r  # nothing half-applied


def test_size_cap_and_box_without_network(net_jail, sbox, pkgs, monkeypatch):
    monkeypatch.setenv("EXECBOX_INSTALL_MAX_BYTES", "10")
    with pytest.raises(PayloadTooLargeError) as e:
        net_jail.install_packages(sbox, pip=[pkgs["py"]])
    assert e.value.http_status == 413
    r = net_jail.execute_code(sbox, f"import {pkgs['py']}", "python", 30)
    assert r.exit_code != 0  # nothing installed
    p = jail_with("none")
    try:
        iid = p.create_instance().instance_id
        with pytest.raises(InvalidConfigError, match="without network"):
            p.install_packages(iid, pip=[pkgs["py"]])
    finally:
        p.shutdown()


@pytest.mark.parametrize(("name", "value"), [("EXECBOX_INSTALL_MAX_BYTES", "256MB"),
                                             ("EXECBOX_INSTALL_MAX_BYTES", "0"),
                                             ("EXECBOX_INSTALL_TIMEOUT", "-5")])
def test_a_bad_install_setting_is_sb002_naming_it(net_jail, sbox, pkgs, monkeypatch, name, value):
    """Both were read leniently: '256MB' became the default and '-5' a negative timeout."""
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidConfigError, match=name) as e:
        net_jail.install_packages(sbox, pip=[pkgs["py"]])
    assert e.value.code == "SB002"


def test_install_over_http_with_remote_sandbox(fakenet, pkgs, monkeypatch):
    from execbox import RemoteSandbox
    from tests.integration.service.conftest import error_of, start_service

    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", pkgs["pip"])
    monkeypatch.setenv("EXECBOX_NPM_REGISTRY", pkgs["npm"])
    p = jail_with("allowlist", [])
    svc = start_service(p)
    try:
        with RemoteSandbox(svc.url, svc.tenant_a, session_id="inst-http") as sb:
            out = sb.install(pip=[pkgs["py"]], npm=[pkgs["js"]])
            assert out["installed"] and out["session_id"] == "inst-http" and out["egress_run_id"]
            r = sb.run_code(f"import {pkgs['py']} as m\nprint(m.answer())")
            assert r.stdout.strip() == "42", r
            with pytest.raises(InvalidConfigError) as e:
                sb.install(pip=["no-such-pkg-http"])
            assert e.value.http_status == 404 and "no-such-pkg-http" in e.value.message
        r = svc.b.post("/v1/sandbox/sessions/tenant-a/inst-http/install", json={"pip": [pkgs["py"]]})
        assert r.status_code == 403  # another tenant's session
        r = svc.a.post("/v1/sandbox/sessions/tenant-a/inst-http/install", json={"pip": ["--index-url=x"]})
        assert r.status_code == 400 and error_of(r)["code"] == "SB002" and "--index-url=x" in error_of(r)["message"]
        assert svc.a.get("/api/admin/runtimes").status_code == 403
        rts = svc.root.get("/api/admin/runtimes").json()["data"]
        assert rts[0]["name"] == "system"
        r = svc.root.get("/api/admin/runtimes/never-built-x")
        assert r.status_code == 400 and "never-built-x" in error_of(r)["message"]
    finally:
        svc.stop()
        p.shutdown()


def test_sandbox_install_library_api(net_jail, pkgs, monkeypatch):
    from execbox import Sandbox

    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", pkgs["pip"])
    with Sandbox.create(net_jail, session_id="install-lib") as sb:
        out = sb.install(pip=[f"{pkgs['py']}==2.0"])
        assert out["installed"] and out["pip"] == [f"{pkgs['py']}==2.0"]
        r = sb.run_code(f"import {pkgs['py']} as m\nprint(m.answer())")
        assert r.stdout.strip() == "42", r
    with pytest.raises(Exception, match="closed"):
        sb.install(pip=[pkgs["py"]])


def test_install_in_a_docker_runc_box(fakenet, pkgs, monkeypatch, docker_engine):
    from execbox.providers.docker import DockerProvider

    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", pkgs["pip"])
    monkeypatch.setenv("EXECBOX_NPM_REGISTRY", pkgs["npm"])
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none", "network": "allowlist",
                  "network_allow": [fakenet.name("www")]})
    try:
        iid = p.create_instance(session_id="install-d").instance_id
        out = p.install_packages(iid, pip=[pkgs["py"]])  # execbox's pip, mounted read-only in the box
        assert out["installed"], out
        r = p.execute_code(iid, f"import {pkgs['py']} as m\nprint(m.answer())", "python", 30)
        assert r.exit_code == 0 and r.stdout.strip() == "42", r
        with pytest.raises(InvalidConfigError, match="npm is not available"):
            p.install_packages(iid, npm=[pkgs["js"]])  # the worker image has node but no npm
    finally:
        p.shutdown()


STAGING = "ls -A .execbox 2>/dev/null | grep -c '^install-'"


def test_a_stale_staging_dir_is_removed_by_the_next_install(net_jail, sbox, pkgs):
    r = net_jail.run_command(sbox, "mkdir -p .execbox/install-left1 && head -c 4000000 /dev/zero > "
                                   ".execbox/install-left1/blob && " + STAGING, 30)
    assert r.stdout.strip() == "1", r  # what an install killed at its timeout leaves
    assert net_jail.install_packages(sbox, pip=[pkgs["py"]])["installed"]
    r = net_jail.run_command(sbox, STAGING, 30)
    assert r.stdout.strip() == "0", r


BLACKHOLE = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
held = []
while True:
    held.append(s.accept()[0])  # accepted, never answered
"""


def test_a_timed_out_install_leaves_no_staging_dir(net_jail, sbox, pkgs, fakenet, monkeypatch):
    port = 8097
    hole = subprocess.Popen(["ip", "netns", "exec", fakenet.prefix, sys.executable, "-c", BLACKHOLE,
                             fakenet.server_ip, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert hole.stdout is not None and "ready" in hole.stdout.readline()
        monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", f"http://{pkgs['host']}:{port}/simple")
        with pytest.raises(ExecutionTimeoutError) as e:
            net_jail.install_packages(sbox, pip=[pkgs["py"]], timeout=3)
        assert e.value.code == "SB005" and "nothing was installed" in e.value.message
    finally:
        hole.kill()
        hole.wait(5)
    r = net_jail.run_command(sbox, STAGING, 30)
    assert r.stdout.strip() == "0", r  # removed right after the timeout, not only by the next install


def test_the_box_disk_limit_before_the_cap_is_413_naming_it(net_jail, sbox, pkgs, fakenet, monkeypatch):
    name = f"bigunpack{os.getpid()}"  # a ~70 KiB download that unpacks to 64 MiB (the box has 32)
    publish_files(fakenet.pkg_root, name, "1.0", {f"{name}/__init__.py": b"", f"{name}/blob.bin": bytes(64 << 20)},
                  deflate=True)
    monkeypatch.setenv("EXECBOX_INSTALL_MAX_BYTES", str(600 << 20))  # the cap is not what stops it
    with pytest.raises(PayloadTooLargeError) as e:
        net_jail.install_packages(sbox, pip=[name])
    assert e.value.code == "SB002" and e.value.http_status == 413, e.value
    assert "ran out of disk space" in e.value.message and "disk_quota_mb=32" in e.value.message
    assert "nothing was installed" in e.value.message and e.value.details["disk_quota_mb"] == 32
    r = net_jail.run_command(sbox, f"python3 -c 'import {name}' 2>&1 | tail -1; " + STAGING, 30)
    assert "ModuleNotFoundError" in r.stdout and r.stdout.strip().endswith("0"), r
