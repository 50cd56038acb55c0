"""Runtime template lifecycle, review 49: the jail's default ``runtime=NAME`` follows the current
version (also for its warm pool, and after the old version is removed), version numbers are never
reused after ``rm``, and ``rm`` takes the Docker images of what it removed with it."""

from __future__ import annotations

import contextlib
import itertools
import os
import time

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime
from execbox.boxes.runtime_publish import SEQ
from execbox.cli import app
from execbox.errors import InvalidConfigError
from tests import pkgindex
from tests.integration.jail.conftest import make_provider

_names = itertools.count(1)


@pytest.fixture(scope="module")
def index(fakenet):
    tag = os.getpid()
    names = {"py": f"lcone{tag}", "py2": f"lctwo{tag}"}
    pkgindex.publish_wheel(fakenet.pkg_root, names["py"], "1.0", "WHO = 'one'\n")
    pkgindex.publish_wheel(fakenet.pkg_root, names["py2"], "1.0", "WHO = 'two'\n")
    base = f"http://{fakenet.server_ip}/pkgs"
    return {**names, "pip": f"{base}/simple", "npm": f"{base}/npm"}


@pytest.fixture
def tpl():
    name = f"t-lc-{os.getpid()}-{next(_names)}"
    yield name
    for made in (name, f"{name}-x"):
        runtime.remove(made, force=True)
        forget_numbers(made)


def forget_numbers(name):
    """Drop a test template's version counter (``rm`` keeps it, so it would stay in the jail dir)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(runtime.runtimes_dir(), SEQ, name))


def _build(name, index, *args):
    return CliRunner().invoke(app, ["runtime", "build", name, "--index-url", index["pip"], *args])


def _wait(what, condition, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_default_runtime_follows_the_current_version(index, tpl):
    """It was resolved once at initialize: after v2 new boxes still got v1, and once v1 was removed
    every default session failed until a restart (with a warm pool, rm v1 was refused instead)."""
    from execbox.boxes.jail_box import drain

    assert _build(tpl, index, "--pip", index["py"]).exit_code == 0  # v1
    cold = make_provider(runtime=tpl)
    pooled = make_provider(runtime=tpl, pool_size=1)
    try:
        first = cold.create_instance(session_id="lc1")
        assert first.metadata["runtime"] == f"{tpl}@v1"
        cold.destroy_instance(first.instance_id)
        _wait("a warm v1 box", lambda: pooled.pool_status()["ready"] == 1)
        assert _build(tpl, index, "--pip", index["py2"]).exit_code == 0  # v2, current
        for kw in ({}, {"session_id": "lc2"}):  # one-shot and session boxes
            inst = cold.create_instance(**kw)
            assert inst.metadata["runtime"] == f"{tpl}@v2", kw
            r = cold.execute_code(inst.instance_id, f"import {index['py2']} as m\nprint(m.WHO)", "python", 30)
            assert r.exit_code == 0 and r.stdout.strip() == "two", r
            cold.destroy_instance(inst.instance_id)
        assert cold.applied_limits()["runtime"] == f"{tpl}@v2"
        drain()

        def removed() -> bool:  # the pool replaces its v1 box; until then rm is refused (in use)
            try:
                return runtime.remove(f"{tpl}@v1")
            except runtime.RuntimeNotUsable as e:
                assert e.http_status == 409, e
                return False

        _wait("the pool to let go of v1", removed)
        assert runtime.versions(tpl) == ["v2"]
        inst = cold.create_instance(session_id="lc3")  # v1 is gone: the default still works
        assert inst.metadata["runtime"] == f"{tpl}@v2"
        _wait("a warm v2 box", lambda: pooled.pool_status()["ready"] == 1)
        inst = pooled.create_instance()
        assert inst.metadata["from_pool"] and inst.metadata["runtime"] == f"{tpl}@v2", inst.metadata
    finally:
        cold.shutdown()
        pooled.shutdown()


def test_rm_then_build_never_reuses_a_version_nor_its_docker_image(index, tpl, docker_engine):
    import docker.errors

    from execbox.boxes.runtime_docker import image_for, image_name
    from execbox.providers.docker import DockerProvider

    assert _build(tpl, index, "--pip", index["py"], "--docker").exit_code == 0  # v1 + its image
    old = image_name(tpl, "v1")
    assert docker_engine.images.get(old).labels.get("execbox.runtime.manifest")
    res = CliRunner().invoke(app, ["runtime", "rm", tpl])
    assert res.exit_code == 0, res.output
    with pytest.raises(docker.errors.ImageNotFound):
        docker_engine.images.get(old)  # removed with its template (it leaked ~800 MB each)
    other = f"{tpl}-x"
    try:
        assert _build(tpl, index, "--pip", index["py2"]).exit_code == 0  # without --docker
        assert runtime.current_version(tpl) == "v2"  # not v1 again: a pin tpl@v1 keeps meaning the old one
        with pytest.raises(runtime.RuntimeNotUsable, match="has no version v1"):
            runtime.resolve(f"{tpl}@v1")
        p = DockerProvider()
        p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})
        try:
            with pytest.raises(InvalidConfigError, match="no Docker image"):
                p.create_instance(runtime=tpl)
        finally:
            p.shutdown()
        # an image under a version's tag that was built from another manifest (an earlier template
        # of the name, or another jail directory on this engine) is not that version's
        assert _build(other, index, "--pip", index["py"], "--docker").exit_code == 0
        docker_engine.images.get(image_name(other, "v1")).tag(f"execbox/runtime-{tpl}", "v2")
        with pytest.raises(runtime.RuntimeNotUsable, match="built from other content"):
            image_for(docker_engine, runtime.resolve(tpl))
        assert image_for(docker_engine, runtime.resolve(other)) == image_name(other, "v1")
    finally:
        runtime.remove(other, force=True)
        for tag in (image_name(tpl, "v2"), image_name(other, "v1")):
            try:
                docker_engine.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
