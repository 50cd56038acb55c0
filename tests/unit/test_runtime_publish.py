"""Publishing a runtime template version: numbers never reused for a name (also after rm), all or
nothing on a full disk, Docker-invalid names refused before a --docker build starts, and a failing
`python -m venv` reported as an SB error by the CLI."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime, runtime_build, runtime_publish
from execbox.boxes.runtime_docker import check_image_name
from execbox.cli import app


@pytest.fixture
def jail(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    return tmp_path


def _publish(name: str, marker: str) -> str:
    """A finished build of ``name`` (a manifest saying ``marker``) published; the version."""
    top = os.path.join(runtime.runtimes_dir(), name)
    os.makedirs(top, exist_ok=True)
    work, held = runtime_build.new_build_dir(top)
    try:
        with open(os.path.join(work, runtime.MANIFEST), "w") as f:
            json.dump({"packages": [marker], "npm": []}, f)
        return runtime_build.publish(top, work)
    finally:
        os.close(held)


def test_version_numbers_are_never_reused_after_rm(jail):
    assert _publish("tpl", "old-1") == "v1"
    assert _publish("tpl", "old-2") == "v2"
    assert runtime.remove("tpl")
    assert _publish("tpl", "new") == "v3"  # not v1 again: a pin tpl@v1 must not change content
    with pytest.raises(runtime.RuntimeNotUsable, match="has no version v1"):
        runtime.resolve("tpl@v1")
    assert runtime.versions("tpl") == ["v3"] and runtime.resolve("tpl").packages == ["new"]


def test_rm_of_the_newest_old_version_does_not_free_its_number(jail):
    _publish("tpl", "a")
    _publish("tpl", "b")
    _publish("tpl", "c")
    assert runtime.remove("tpl@v2")
    assert _publish("tpl", "d") == "v4"
    assert [v for v in os.listdir(runtime.runtimes_dir()) if not v.startswith(".")] == ["tpl"]  # .seq is hidden


@pytest.mark.parametrize("failing", ["symlink", "replace"])
def test_a_full_disk_at_publish_publishes_nothing(jail, failing):
    """ENOSPC making the `current` link (or swapping it) used to leave the renamed version listed
    but not current behind a build reported as failed, with an OSError traceback."""
    assert _publish("tpl", "good") == "v1"
    top = os.path.join(runtime.runtimes_dir(), "tpl")
    work, held = runtime_build.new_build_dir(top)
    with open(os.path.join(work, runtime.MANIFEST), "w") as f:
        json.dump({"packages": ["bad"], "npm": []}, f)
    real = getattr(os, failing)

    def full(src, dst, *a, **kw):
        if os.path.basename(str(dst)) in (f".current-{os.getpid()}", runtime.CURRENT):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *a, **kw)

    try:
        with pytest.MonkeyPatch.context() as mp, pytest.raises(runtime.RuntimeNotUsable) as e:
            mp.setattr(runtime_publish.os, failing, full)
            runtime_build.publish(top, work)
    finally:
        os.close(held)
    assert e.value.code == "SB002" and "disk is full" in e.value.message and "nothing was published" in e.value.message
    assert runtime.versions("tpl") == ["v1"] and runtime.current_version("tpl") == "v1"
    assert os.path.isdir(work)  # still the build's: build() removes it
    assert not [n for n in os.listdir(top) if n.startswith(".current-")]


@pytest.mark.parametrize("name", ["dk-", "a..b", "a.-b", "a_-b", "x.", "a___b"])
def test_a_docker_invalid_name_is_refused_before_a_docker_build_starts(jail, name):
    with pytest.raises(runtime.RuntimeNotUsable) as e:
        runtime_build.build(name, pip=["six"], docker=object())  # a docker client is never reached
    assert e.value.code == "SB002" and "Docker image" in e.value.message
    assert not os.path.exists(os.path.join(runtime.runtimes_dir(), name))  # nothing was started


@pytest.mark.parametrize("name", ["dk", "a.b", "a-b", "a--b", "a__b", "a_b.c-d", "9"])
def test_docker_valid_names_pass(name):
    assert check_image_name(name) == name


def test_a_failing_venv_step_is_an_sb_error(jail, monkeypatch):
    real = subprocess.run

    def run(argv, *a, **kw):
        if isinstance(argv, list) and "venv" in argv:
            return subprocess.CompletedProcess(argv, 1, stdout=b"Error: Command '...ensurepip' returned 1\n")
        return real(argv, *a, **kw)

    monkeypatch.setattr(runtime_build.subprocess, "run", run)
    res = CliRunner().invoke(app, ["runtime", "build", "venvfail"])
    assert res.exit_code == 2 and "SB002" in res.output and "venv" in res.output, res.output
    assert "ensurepip" in res.output and "Traceback" not in res.output
    assert isinstance(res.exception, SystemExit)
    assert runtime.versions("venvfail") == []
