"""In-session install, review 49: the index is shown to tenants as scheme://host[:port]/… only (a
token in its path stays out of messages, details and pip's output), a missing build requirement
is named (not the requested package), and over HTTP an install takes the run path: one audit row
(operation ``install``), the ``execbox_executions`` metric, and the tenant's execution slot."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from execbox.errors import ConnectionFailedError, InvalidConfigError
from tests import pkgindex

from .conftest import jail_with

SECRET = "tok-SEKRET4949"
SETUP = "from setuptools import setup\nsetup(name={name!r}, version='1.0', py_modules=[{name!r}])\n"


def publish_sdist(root: str, name: str) -> None:
    """``<name>-1.0.tar.gz`` (a setup.py project: pip needs setuptools to build it) and its page."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for fn, text in ((f"{name}-1.0/setup.py", SETUP.format(name=name)), (f"{name}-1.0/{name}.py", "X = 1\n"),
                         (f"{name}-1.0/PKG-INFO", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")):
            data = text.encode()
            info = tarfile.TarInfo(fn)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    with open(os.path.join(root, "files", f"{name}-1.0.tar.gz"), "wb") as f:
        f.write(blob)
    os.makedirs(os.path.join(root, "simple", name), exist_ok=True)
    with open(os.path.join(root, "simple", name, "index.html"), "w", encoding="utf-8") as f:
        f.write(f'<a href="../../files/{name}-1.0.tar.gz#sha256={hashlib.sha256(blob).hexdigest()}">'
                f"{name}-1.0.tar.gz</a>\n")


@pytest.fixture(scope="module")
def idx(fakenet):
    tag = os.getpid()
    names = {"py": f"acctpkg{tag}", "sd": f"sdneedsbuild{tag}"}
    pkgindex.publish_wheel(fakenet.pkg_root, names["py"], "1.0", "def answer():\n    return 49\n")
    publish_sdist(fakenet.pkg_root, names["sd"])
    if not os.path.lexists(os.path.join(fakenet.pkg_root, SECRET)):  # the same index under a secret path
        os.symlink(".", os.path.join(fakenet.pkg_root, SECRET))
    host = fakenet.name("pkgs")
    return {**names, "host": host, "pip": f"http://{host}/pkgs/{SECRET}/simple"}


@pytest.fixture(scope="module")
def net_jail(fakenet):
    p = jail_with("allowlist", [])
    yield p
    p.shutdown()


@pytest.fixture
def sbox(net_jail, idx, monkeypatch):
    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", idx["pip"])
    inst = net_jail.create_instance(session_id="install-acct")
    yield inst.instance_id
    net_jail.destroy_instance(inst.instance_id)


def _shown(e: Exception) -> str:
    return f"{getattr(e, 'message', e)} {getattr(e, 'details', '')}"


def test_a_token_in_the_index_path_is_never_shown_to_the_tenant(net_jail, sbox, idx, fakenet, monkeypatch):
    assert net_jail.install_packages(sbox, pip=[idx["py"]])["installed"]  # the secret path is a working index
    with pytest.raises(InvalidConfigError) as e:
        net_jail.install_packages(sbox, pip=["no-such-pkg-r49"])
    assert e.value.http_status == 404 and "no-such-pkg-r49" in e.value.message
    assert SECRET not in _shown(e.value), _shown(e.value)
    assert e.value.details["index"] == f"http://{idx['host']}/…"
    assert f"Looking in indexes: http://{idx['host']}/…" in e.value.details["output"]
    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", f"http://{idx['host']}:8099/pkgs/{SECRET}/simple")  # no listener
    with pytest.raises(ConnectionFailedError) as e:
        net_jail.install_packages(sbox, pip=[idx["py"]])
    assert e.value.code == "SB003" and f"http://{idx['host']}:8099/…" in e.value.message
    assert SECRET not in _shown(e.value), _shown(e.value)


def test_a_missing_build_requirement_is_named(net_jail, sbox, idx):
    """The sdist is on the index, setuptools (its build requirement) is not: that is what failed."""
    with pytest.raises(InvalidConfigError) as e:
        net_jail.install_packages(sbox, pip=[idx["sd"]])
    assert e.value.http_status == 404, e.value
    assert e.value.details["package"].startswith("setuptools") and e.value.details["dependency"] is True
    assert "'setuptools" in e.value.message and f"needed by {idx['sd']}" in e.value.message
    assert f"package {idx['sd']!r} was not found" not in e.value.message


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_an_install_over_http_is_audited_counted_and_takes_an_execution_slot(idx, monkeypatch):
    from execbox.service.config import ServiceSettings
    from tests.integration.service.conftest import error_of, start_service

    monkeypatch.setenv("EXECBOX_PIP_INDEX_URL", idx["pip"])
    p = jail_with("allowlist", [])
    svc = start_service(p, ServiceSettings(tenant_max_executions=1, audit_code=True))
    held, release = threading.Event(), threading.Event()

    def busy() -> None:  # the tenant's one execution slot is taken (a run in progress)
        with svc.app.state.services.sessions.execution_slot("tenant-a"):
            held.set()
            release.wait(60)

    t = threading.Thread(target=busy)
    try:
        t.start()
        assert held.wait(10)
        url = "/v1/sandbox/sessions/tenant-a/acct/install"
        r = svc.a.post(url, json={"pip": [idx["py"]]})
        assert r.status_code == 429 and error_of(r)["code"] == "SB008", r.text  # it used to run anyway
        assert error_of(r)["details"]["reason"] == "tenant_max_executions"
        release.set()
        t.join()
        r = svc.a.post(url, json={"pip": [idx["py"]]}, timeout=120)
        assert r.status_code == 200 and r.json()["installed"], r.text
        r = svc.a.post(url, json={"pip": ["no-such-pkg-acct"]}, timeout=120)
        assert r.status_code == 404 and error_of(r)["code"] == "SB002" and SECRET not in r.text
        svc.app.state.services.audit.flush()
        rows = [row for row in svc.store.audit.list(tenant_id="tenant-a") if row["operation"] == "install"]
        assert sorted((row["status"], row["error_code"], row["code"]) for row in rows) == [
            ("error", "SB002", "pip no-such-pkg-acct"), ("error", "SB008", f"pip {idx['py']}"),
            ("success", None, f"pip {idx['py']}")]
        assert all(row["session_id"] == "acct" and row["language"] == "packages" for row in rows)
        m = _samples(svc.client().get("/metrics").text)
        assert m[("execbox_executions_total", (("language", "packages"), ("provider", "jail"),
                                               ("status", "success")))] == 1
        assert m[("execbox_executions_total", (("language", "packages"), ("provider", "jail"),
                                               ("status", "error")))] == 1
    finally:
        release.set()
        t.join()
        svc.stop()
        p.shutdown()
