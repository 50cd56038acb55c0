"""A template build takes every byte from the configured index and runs no package code on the
host, whatever the packages' metadata says: a wheel on the index may declare a dependency on a
direct URL (``x @ http://...`` / ``x @ file:///...``), which pip fetches and *builds* despite
``--only-binary``; an npm package may depend on a URL or a path. pip and npm run in a jail box
(the version read-write, the index hosts only) and such dependencies fail the build, naming them."""

from __future__ import annotations

import glob
import io
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime
from execbox.cli import app
from tests import pkgindex

from .wheels import publish_files

BACKEND = """
import os
open({marker!r}, "a").write("build backend of {name} ran: uid %d\\n" % os.getuid())  # on import
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, "{name}-1.0.dist-info")
    os.makedirs(d)
    open(os.path.join(d, "METADATA"), "w").write("Metadata-Version: 2.1\\nName: {name}\\nVersion: 1.0\\n")
    return "{name}-1.0.dist-info"
"""
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'


def _project(name: str, marker: str) -> dict[str, str]:
    """An sdist / source tree whose in-tree build backend (no build dependency needed) writes ``marker``."""
    return {"pyproject.toml": PYPROJECT, "backend.py": BACKEND.format(marker=marker, name=name),
            "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"}


@pytest.fixture(scope="module")
def hostile(fakenet, tmp_path_factory):
    tag = os.getpid()
    root = fakenet.pkg_root
    where = tmp_path_factory.mktemp("hostile")
    marker = str(where / "package-code-ran-on-the-host")
    names = {"ok": f"srcok{tag}", "url": f"depurl{tag}", "file": f"depfile{tag}", "evil_url": f"evilurl{tag}",
             "evil_dir": f"evildir{tag}", "js": f"srcjs{tag}", "js_url": f"jsurldep{tag}", "js_file": f"jsfiledep{tag}"}
    pkgindex.publish_wheel(root, names["ok"], "1.0", "V = 1\n")
    buf = io.BytesIO()  # the sdist a direct URL points at: served by the index host itself
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for fn, text in _project(names["evil_url"], marker).items():
            info = tarfile.TarInfo(f"{names['evil_url']}-1.0/{fn}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    with open(os.path.join(root, "files", f"{names['evil_url']}-1.0.tar.gz"), "wb") as f:
        f.write(buf.getvalue())
    url = f"http://{fakenet.server_ip}/pkgs/files/{names['evil_url']}-1.0.tar.gz"
    pkgindex.publish_wheel(root, names["url"], "1.0", "", requires=(f"{names['evil_url']} @ {url}",))
    tree = where / "evildir"  # a source tree on the host
    tree.mkdir()
    for fn, text in _project(names["evil_dir"], marker).items():
        (tree / fn).write_text(text)
    pkgindex.publish_wheel(root, names["file"], "1.0", "", requires=(f"{names['evil_dir']} @ file://{tree}",))
    pkgindex.publish_npm(root, names["js"], "1.0.0", "module.exports = 1;\n")
    pkgindex.publish_npm(root, names["js_url"], "1.0.0", "module.exports = 2;\n",
                         {"remote": f"http://{fakenet.server_ip}/pkgs/npm/-/{names['js']}-1.0.0.tgz"})
    pkgindex.publish_npm(root, names["js_file"], "1.0.0", "module.exports = 3;\n", {"hostdir": f"file:{tree}"})
    base = f"http://{fakenet.server_ip}/pkgs"
    return {**names, "marker": marker, "pip": f"{base}/simple", "npm": f"{base}/npm", "sdist_url": url,
            "tree": str(tree)}


@pytest.fixture
def tpl(hostile):
    name = f"t-src-{os.getpid()}"
    yield name
    runtime.remove(name, force=True)


def _build(name, hostile, *args):
    return CliRunner().invoke(app, ["runtime", "build", name, "--index-url", hostile["pip"],
                                    "--npm-registry", hostile["npm"], *args])


def _unchanged(name: str, version: str | None) -> None:
    assert version and runtime.current_version(name) == version and runtime.versions(name) == [version]
    assert not [d for d in os.listdir(os.path.join(runtime.runtimes_dir(), name)) if d.startswith(".build")]


def test_a_direct_url_dependency_fails_the_build_and_nothing_of_it_runs(hostile, tpl):
    res = _build(tpl, hostile, "--pip", hostile["ok"], "--npm", hostile["js"])
    assert res.exit_code == 0, res.output
    before = runtime.current_version(tpl)
    for key, dep, where in (("url", "evil_url", hostile["sdist_url"]), ("file", "evil_dir", hostile["tree"])):
        res = _build(tpl, hostile, "--pip", hostile["ok"], "--pip", hostile[key])
        out = " ".join(res.output.split())  # the console wraps long lines
        assert res.exit_code == 2 and "SB002" in out, out
        assert "direct URL" in out and hostile[dep] in out and where in out and hostile[key] in out, out
        assert not os.path.exists(hostile["marker"]), open(hostile["marker"]).read()
        _unchanged(tpl, before)


def test_an_npm_dependency_that_is_not_a_registry_version_fails_the_build(hostile, tpl):
    assert _build(tpl, hostile, "--npm", hostile["js"]).exit_code == 0
    before = runtime.current_version(tpl)
    for key, dep in (("js_url", "remote"), ("js_file", "hostdir")):
        res = _build(tpl, hostile, "--npm", hostile[key])
        out = " ".join(res.output.split())
        assert res.exit_code == 2 and "SB002" in out and dep in out and "not" in out and "registry" in out, out
        _unchanged(tpl, before)
    made = runtime.resolve(tpl).host_dir or ""
    assert not os.path.lexists(os.path.join(made, "node_modules", "hostdir"))


def test_pip_dies_with_a_build_that_is_killed(hostile, fakenet, tpl):
    """SIGKILL of the CLI: the box (pip and all) goes with it (bwrap --die-with-parent), while a pip
    started on the host went on alone for the ~10 s this install takes, writing into the build dir."""
    name = f"slowpkg{os.getpid()}"
    publish_files(fakenet.pkg_root, name, "1.0", {f"{name}/f{i}.py": b"" for i in range(60000)}, deflate=True)
    env = {**os.environ, "EXECBOX_PIP_INDEX_URL": hostile["pip"]}
    cli = subprocess.Popen([sys.executable, "-m", "execbox", "runtime", "build", tpl, "--pip", name], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        unpacking: list[str] = []  # pip is writing the package's files (and prints nothing meanwhile)
        while time.monotonic() < deadline and not unpacking:
            unpacking = glob.glob(os.path.join(runtime.runtimes_dir(), tpl, ".build-*", "lib", "python3*",
                                               "site-packages", name, "f1*.py"))
            time.sleep(0.05)
        assert unpacking, "pip never started"
        box = _descendants(cli.pid)
        assert [p for p in box if b"--only-binary" in _cmdline(p)], "pip is not the build's"
        cli.send_signal(signal.SIGKILL)
        cli.wait(10)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and [p for p in box if _cmdline(p)]:
            time.sleep(0.1)
        assert not [p for p in box if _cmdline(p)], "processes of the build box outlived the build"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
    assert not runtime.versions(tpl)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
