"""Runtime templates built from a local package index (pip simple index + npm registry in the
fake internet): versioned, immutable, selectable per instance, a failed build keeps the previous."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime
from execbox.boxes.runtime_publish import SEQ
from execbox.cli import app
from execbox.errors import InvalidConfigError
from tests import pkgindex

from .conftest import jail_with
from .wheels import publish_files

TINY_PY = "VALUE = 'tinypkg {version}'\ndef hello(name):\n    return f'hello {{name}} from tinypkg'\n"
TINY_JS = "module.exports = { get: (u) => 'fake axios GET ' + u, version: '{version}' };\n"


@pytest.fixture(scope="module")
def index(fakenet):
    tag = os.getpid()
    names = {"py": f"tinypkg{tag}", "js": f"tinyaxios{tag}"}
    pkgindex.publish_wheel(fakenet.pkg_root, names["py"], "1.0", TINY_PY.format(version="1.0"))
    pkgindex.publish_npm(fakenet.pkg_root, names["js"], "1.0.0", TINY_JS.replace("{version}", "1.0.0"))
    base = f"http://{fakenet.server_ip}/pkgs"
    return {**names, "pip": f"{base}/simple", "npm": f"{base}/npm"}


_names = itertools.count(1)


@pytest.fixture
def tpl_name():
    name = f"t-tpl-{os.getpid()}-{next(_names)}"  # a name's version numbers are never reused, also after rm
    yield name
    for made in (name, f"{name}-js", f"{name}-child"):
        runtime.remove(made, force=True)
        with contextlib.suppress(OSError):  # rm keeps the name's version counter: not a test's to leave
            os.unlink(os.path.join(runtime.runtimes_dir(), SEQ, made))


def _build(name, index, *args):
    res = CliRunner().invoke(app, ["runtime", "build", name, "--index-url", index["pip"],
                                   "--npm-registry", index["npm"], *args])
    return res


def test_template_from_local_index_imports_and_requires_in_a_jail_box(index, tpl_name):
    res = _build(tpl_name, index, "--pip", index["py"], "--npm", index["js"])
    assert res.exit_code == 0, res.output
    assert f"{tpl_name}@v1" in res.output
    shown = json.loads(CliRunner().invoke(app, ["runtime", "show", tpl_name, "--json"]).output)
    assert shown["pip"] == [index["py"]] and shown["npm"] == [index["js"]] and shown["version"] == "v1"
    assert shown["pip_index"] == index["pip"]
    p = jail_with("none")
    try:
        inst = p.create_instance(runtime=tpl_name)  # per instance; the provider's own runtime is 'system'
        assert inst.metadata["runtime"] == f"{tpl_name}@v1"
        r = p.execute_code(inst.instance_id, f"import {index['py']} as t\nprint(t.hello('box'), t.VALUE)",
                           "python", 30)
        assert r.exit_code == 0 and r.stdout.strip() == "hello box from tinypkg tinypkg 1.0", r
        r = p.execute_code(inst.instance_id, f"const ax = require('{index['js']}');\n"
                                             "console.log(ax.get('/x'), ax.version);", "javascript", 30)
        assert r.exit_code == 0 and r.stdout.strip() == "fake axios GET /x 1.0.0", r
        r = p.run_command(inst.instance_id, f"python -c 'import {index['py']}'; touch "
                                            f"{runtime.RUNTIME_MOUNT}/x 2>&1; echo rc=$?", 30)
        assert "rc=1" in r.stdout, r  # the template is mounted read-only
        other = p.create_instance()  # without runtime=: the provider's runtime, no template packages
        r = p.execute_code(other.instance_id, f"import {index['py']}", "python", 30)
        assert r.exit_code != 0 and "ModuleNotFoundError" in r.stderr
    finally:
        p.shutdown()


def test_failed_build_keeps_previous_version_and_from_extends(index, tpl_name):
    assert _build(tpl_name, index, "--pip", index["py"]).exit_code == 0
    res = _build(tpl_name, index, "--pip", "no-such-package-xyz")
    assert res.exit_code == 2 and "SB002" in res.output and "no-such-package-xyz" in res.output, res.output
    assert runtime.current_version(tpl_name) == "v1" and runtime.versions(tpl_name) == ["v1"]
    assert not [d for d in os.listdir(os.path.join(runtime.runtimes_dir(), tpl_name)) if d.startswith(".build")]
    child = f"{tpl_name}-js"
    try:
        res = _build(child, index, "--from", tpl_name, "--npm", index["js"])
        assert res.exit_code == 0, res.output
        made = runtime.resolve(child)
        assert made.packages == [index["py"]] and made.npm == [index["js"]]
        assert runtime.describe(made)["from"] == f"{tpl_name}@v1"
        killed = os.path.join(runtime.runtimes_dir(), tpl_name, ".build-killed")  # a build killed earlier
        os.makedirs(os.path.join(killed, "lib"))
        os.utime(killed, (time.time() - 3600, time.time() - 3600))
        assert _build(tpl_name, index, "--pip", index["py"]).exit_code == 0  # v2; v1 stays usable pinned
        assert not os.path.exists(killed)  # the next build removed it
        assert runtime.current_version(tpl_name) == "v2"
        assert runtime.resolve(f"{tpl_name}@v1").host_dir != runtime.resolve(tpl_name).host_dir
        with pytest.raises(runtime.RuntimeNotUsable, match="current version"):
            runtime.remove(f"{tpl_name}@v2")
        assert runtime.remove(f"{tpl_name}@v1") and runtime.versions(tpl_name) == ["v2"]
    finally:
        runtime.remove(child)


def test_bad_input_is_refused_naming_it(index, tpl_name):
    for args, word in ((["--pip", "https://evil.example/x.whl"], "https://evil.example/x.whl"),
                       (["--npm", "git+ssh://x/y"], "git+ssh://x/y"), (["--pip", "--pre"], "--pre")):
        res = CliRunner().invoke(app, ["runtime", "build", tpl_name, *args])
        assert res.exit_code != 0 and "SB002" in res.output and word in res.output, res.output
    with pytest.raises(runtime.RuntimeNotUsable, match="not installed"):
        runtime.resolve_runtime("never-built-x")
    p = jail_with("none")
    try:
        with pytest.raises(InvalidConfigError, match="never-built-x"):
            p.create_instance(runtime="never-built-x")
    finally:
        p.shutdown()


def test_template_as_docker_image_for_runc_boxes(index, tpl_name, docker_engine):
    from execbox.boxes.runtime_docker import image_name
    from execbox.providers.docker import DockerProvider

    res = _build(tpl_name, index, "--pip", index["py"], "--npm", index["js"], "--docker")
    assert res.exit_code == 0, res.output
    tag = image_name(tpl_name, "v1")
    try:
        p = DockerProvider()
        p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})
        try:
            inst = p.create_instance(runtime=tpl_name)
            assert inst.metadata["runtime"] == f"{tpl_name}@v1"
            r = p.execute_code(inst.instance_id, f"import {index['py']} as t\nprint(t.hello('ctr'))", "python", 30)
            assert r.exit_code == 0 and r.stdout.strip() == "hello ctr from tinypkg", r
            r = p.execute_code(inst.instance_id, f"console.log(require('{index['js']}').get('/d'))",
                               "javascript", 30)
            assert r.exit_code == 0 and r.stdout.strip() == "fake axios GET /d", r
            with pytest.raises(InvalidConfigError, match="no Docker image"):
                assert _build(tpl_name, index, "--pip", index["py"]).exit_code == 0  # v2 without --docker
                p.create_instance(runtime=tpl_name)
        finally:
            p.shutdown()
    finally:
        docker_engine.images.remove(tag, force=True)


def test_runtime_per_session_and_run_over_http(index, tpl_name):
    from tests.integration.service.conftest import error_of, start_service

    assert _build(tpl_name, index, "--pip", index["py"]).exit_code == 0
    p = jail_with("none")
    svc = start_service(p)
    code = f"import {index['py']} as t\nprint(t.VALUE)"
    try:
        r = svc.a.post("/v1/sandbox/execute", json={"code": code, "session_id": "rt1", "runtime": tpl_name})
        assert r.status_code == 200 and r.json()["stdout"].strip() == "tinypkg 1.0", r.text
        assert r.json()["metadata"]["runtime"] == f"{tpl_name}@v1"
        r = svc.a.post("/v1/sandbox/bash", json={"command": "echo $NODE_PATH", "session_id": "rt1"})
        assert r.status_code == 200 and r.json()["metadata"]["runtime"] == f"{tpl_name}@v1"  # kept
        r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "rt1", "runtime": "system"})
        assert r.status_code == 409 and error_of(r)["code"] == "SB002", r.text
        assert svc.a.get("/v1/sandbox/sessions/tenant-a/rt1").json()["runtime"] == tpl_name
        r = svc.a.post("/v1/sandbox/execute", json={"code": code, "runtime": f"{tpl_name}@v1"})  # one-shot
        assert r.status_code == 200 and r.json()["stdout"].strip() == "tinypkg 1.0", r.text
        r = svc.a.post("/v1/sandbox/execute", json={"code": code})  # the provider's default runtime
        assert r.status_code == 200 and "ModuleNotFoundError" in r.json()["stderr"]
        r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "rt2", "runtime": "never-built-x"})
        assert r.status_code == 400 and "never-built-x" in error_of(r)["message"], r.text
        r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "runtime": "../etc"})
        assert r.status_code == 400
    finally:
        svc.stop()
        p.shutdown()


FAKE_FONT_MANAGER = b"""
import json, os, sys
with open(os.path.join(os.environ["MPLCONFIGDIR"], "fontlist-v0test.json"), "w") as f:
    json.dump({"_version": "0test", "uid": os.getuid(), "prefix": sys.prefix}, f)
"""


def test_the_build_runs_no_package_code_on_the_host(index, fakenet, tpl_name, tmp_path):
    """A wheel's .pth file runs whenever the version's interpreter starts with site processing:
    neither pip (also with --from, where the parent's .pth is already installed) nor the font-cache
    step may start it that way on the host; matplotlib's font list is made in a box instead."""
    marker = tmp_path / "ran-on-the-host"
    hook = f"import os; open({str(marker)!r}, 'a').write('pid %d uid %d\\n' % (os.getpid(), os.getuid()))\n"
    publish_files(fakenet.pkg_root, "matplotlib", "0.1", {
        "matplotlib/__init__.py": b"", "matplotlib/font_manager.py": FAKE_FONT_MANAGER,
        "matplotlib-init.pth": hook.encode(),
        # a wheel may also install over the venv's interpreter and its pyvenv.cfg (the --from child
        # copies both): a script that would run as root the next time the host starts "the venv's python"
        "matplotlib-0.1.data/scripts/python": f"#!/bin/sh\necho script >> {marker}\n".encode(),
        "matplotlib-0.1.data/data/pyvenv.cfg": b"home = /nonexistent\ninclude-system-site-packages = true\n"})
    res = _build(tpl_name, index, "--pip", "matplotlib")
    assert res.exit_code == 0, res.output
    assert not marker.exists(), marker.read_text()
    v1 = runtime.resolve(tpl_name).host_dir or ""
    assert os.path.islink(os.path.join(v1, "bin", "python"))  # made afresh after pip
    assert "/nonexistent" not in open(os.path.join(v1, "pyvenv.cfg")).read()
    seed = json.loads(open(os.path.join(v1, runtime.MPL_SEED, "fontlist-v0test.json")).read())
    assert seed == {"_version": "0test", "uid": 1000, "prefix": runtime.RUNTIME_MOUNT}  # made in a box
    child = f"{tpl_name}-child"
    try:
        res = _build(child, index, "--from", tpl_name, "--pip", index["py"])
        assert res.exit_code == 0, res.output
        assert not marker.exists(), marker.read_text()  # pip under the child's interpreter: no site
        made = runtime.resolve(child)
        assert made.packages == ["matplotlib", index["py"]]
        assert os.path.isfile(os.path.join(made.host_dir or "", runtime.MPL_SEED, "fontlist-v0test.json"))
        p = jail_with("none")
        try:
            inst = p.create_instance(runtime=child)
            r = p.execute_code(inst.instance_id, f"import {index['py']}, matplotlib.font_manager; print('ok')",
                               "python", 30)
            assert r.exit_code == 0 and r.stdout.strip() == "ok", r
        finally:
            p.shutdown()
    finally:
        runtime.remove(child, force=True)
    # the hook is live: the version's interpreter started normally runs it
    subprocess.run([os.path.join(v1, "bin", "python"), "-c", "pass"], check=True, capture_output=True)
    assert marker.exists()


def test_rm_refuses_a_version_a_running_box_mounts(index, tpl_name):
    from execbox.boxes.jail_box import drain

    assert _build(tpl_name, index).exit_code == 0  # v1
    assert _build(tpl_name, index).exit_code == 0  # v2, current
    p = jail_with("none")
    try:
        old = p.create_instance(runtime=f"{tpl_name}@v1")
        rm = subprocess.run([sys.executable, "-m", "execbox", "runtime", "rm", f"{tpl_name}@v1"],
                            capture_output=True, text=True, timeout=120)  # the operator's CLI: another process
        assert rm.returncode == 2 and "SB002" in rm.stdout and "in use" in rm.stdout, rm.stdout + rm.stderr
        r = p.execute_code(old.instance_id, "import sys; print(sys.prefix)", "python", 30)
        assert r.exit_code == 0 and r.stdout.strip() == runtime.RUNTIME_MOUNT, r
        with pytest.raises(runtime.RuntimeNotUsable, match="in use") as e:
            runtime.remove(tpl_name)  # every version goes with the template: v1 is in use
        assert e.value.http_status == 409
        p.destroy_instance(old.instance_id)
        cur = p.create_instance(runtime=tpl_name)  # v2, the current one
        drain()
        assert runtime.remove(f"{tpl_name}@v1") and runtime.versions(tpl_name) == ["v2"]
        with pytest.raises(runtime.RuntimeNotUsable, match=f"{tpl_name} is in use"):
            runtime.remove(tpl_name)
        assert runtime.versions(tpl_name) == ["v2"]
        res = CliRunner().invoke(app, ["runtime", "rm", tpl_name, "--force"])
        assert res.exit_code == 0 and not os.path.exists(os.path.join(runtime.runtimes_dir(), tpl_name)), res.output
        p.destroy_instance(cur.instance_id)
    finally:
        p.shutdown()
