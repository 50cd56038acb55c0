"""A template build runs pip under the new version's interpreter without running any package
code on the host: no .pth file, no sitecustomize, no import of a module the venv ships."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from execbox.boxes import build_isolation, runtime_build
from execbox.boxes.runtime import SYSTEM_PYTHON, RuntimeNotUsable

PY = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable  # what builds use


@pytest.fixture
def venv(tmp_path):
    """A venv (made like a template's) whose site-packages holds package code that would mark
    ``marker`` if it ran, and the metadata of an installed distribution."""
    work = tmp_path / "v1"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(work)], check=True)
    site = next(work.glob("lib/python3*/site-packages"))
    marker = tmp_path / "marker"
    code = f"import os; open({str(marker)!r}, 'a').write('%s ' % __name__)"
    (site / "evil-init.pth").write_text(code.replace("__name__", "'pth'") + "\n")
    (site / "sitecustomize.py").write_text(code + "\n")
    (site / "evilmod.py").write_text(code + "\n")
    dist = site / "fakedist-1.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\nVersion: 1.2\n")
    (dist / "RECORD").write_text("")
    (dist / "INSTALLER").write_text("pip\n")
    return work, marker


def test_pip_reads_the_venv_s_packages_without_running_them(venv):
    work, marker = venv
    proc = subprocess.run(build_isolation.pip_argv(str(work), ["list", "--format", "json",
                                                               "--disable-pip-version-check"], PY),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = {d["name"]: d["version"] for d in json.loads(proc.stdout)}
    assert listed.get("fakedist") == "1.2"  # pip sees the venv (sys.prefix) and its metadata
    assert not marker.exists(), marker.read_text()
    # the interpreter started normally would have run them (what `pip --python` did)
    subprocess.run([str(work / "bin" / "python"), "-I", "-c", "pass"], check=True)
    assert "pth" in marker.read_text()


def test_a_module_only_the_venv_has_is_not_imported(venv, tmp_path, monkeypatch):
    work, marker = venv
    runner = tmp_path / "runner.py"
    runner.write_text("import sys, json\n"
                      "try:\n    import evilmod\n    print('imported')\nexcept ImportError as e:\n"
                      "    print('refused', e.name)\n"
                      "import email.message, json as j  # the standard library still imports\n"
                      "print(sys.prefix)\n")
    monkeypatch.setattr(build_isolation, "pip_runner", lambda: str(runner))
    proc = subprocess.run(build_isolation.pip_argv(str(work), [], PY), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["refused evilmod", str(work)], proc.stdout
    assert not marker.exists()


def test_no_matplotlib_means_no_font_cache_and_no_interpreter_run(venv, monkeypatch):
    work, marker = venv

    def no_box(_work, **_kw):
        raise AssertionError("a box was started for a version without matplotlib")

    monkeypatch.setattr(runtime_build, "font_lists_in_box", no_box)
    assert runtime_build.font_cache(str(work)) is None
    assert not (work / "mpl-seed").exists() and not marker.exists()


def test_the_font_lists_from_the_box_are_checked(tmp_path, monkeypatch):
    work = tmp_path / "v1"
    (work / "lib" / "python3.11" / "site-packages" / "matplotlib").mkdir(parents=True)
    (work / "lib" / "python3.11" / "site-packages" / "matplotlib" / "__init__.py").write_text("")
    lists = {"fontlist-v390.json": '{"_version": 390}', "../../escape.json": "{}", "fontlist-x.txt": "{}",
             "fontlist-v1/../x.json": "{}"}
    monkeypatch.setattr(runtime_build, "font_lists_in_box", lambda _w: build_isolation._font_lists(
        {"exit_code": 0, "result": {"present": True, "json": json.dumps(lists)}}))
    assert runtime_build.font_cache(str(work)) is None
    assert os.listdir(work / "mpl-seed") == ["fontlist-v390.json"]
    assert not (tmp_path / "escape.json").exists()
    with pytest.raises(RuntimeNotUsable, match="not JSON"):
        build_isolation._font_lists({"exit_code": 0, "result": {"present": True,
                                                                "json": json.dumps({"fontlist-a.json": "{x"})}})
    with pytest.raises(RuntimeNotUsable, match="font cache failed: ImportError: boom"):
        build_isolation._font_lists({"exit_code": 1, "stderr": "ImportError: boom", "result": None})


def test_font_cache_is_skipped_with_the_reason_when_no_box_can_start(tmp_path, monkeypatch):
    work = tmp_path / "v1"
    (work / "lib" / "python3.11" / "site-packages" / "matplotlib").mkdir(parents=True)
    (work / "lib" / "python3.11" / "site-packages" / "matplotlib" / "__init__.py").write_text("")

    def no_box(_w):
        raise build_isolation.NoBox("bubblewrap is not installed")

    monkeypatch.setattr(runtime_build, "font_lists_in_box", no_box)
    assert "bubblewrap is not installed" in (runtime_build.font_cache(str(work)) or "")
    assert not (work / "mpl-seed").exists()


def test_a_replaced_interpreter_or_pyvenv_cfg_never_runs_and_is_put_back(venv, tmp_path):
    """A wheel can install ``*.data/scripts/python`` over the venv's interpreter link and
    ``*.data/data/pyvenv.cfg`` over its config; a ``--from`` build copies both. pip runs under
    the build's own interpreter, and the venv's links and config are made afresh."""
    work, _ = venv
    marker = tmp_path / "ran"
    for name in ("python", "python3"):
        (work / "bin" / name).unlink()
        (work / "bin" / name).write_text(f"#!/bin/sh\necho ran > {marker}\n")
        (work / "bin" / name).chmod(0o755)
    (work / "pyvenv.cfg").write_text("home = /nonexistent\ninclude-system-site-packages = true\n")
    proc = subprocess.run(build_isolation.pip_argv(str(work), ["--version"], PY), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "pip" in proc.stdout, proc.stderr
    assert not marker.exists()
    build_isolation.reset_interpreter(str(work), PY)
    for name in ("python", "python3"):
        assert os.path.islink(work / "bin" / name), name
        assert os.path.realpath(work / "bin" / name) == os.path.realpath(PY)
    cfg = (work / "pyvenv.cfg").read_text()
    assert "/nonexistent" not in cfg and "include-system-site-packages = false" in cfg
    subprocess.run([str(work / "bin" / "python"), "-c", "pass"], check=True)
    assert not marker.exists()
