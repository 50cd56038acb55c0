"""The host's side of a template build's box (boxes/build_box.py): what comes back from the box is
checked, the version is taken back from the box's uid, and no box means no build, never pip on the host."""

from __future__ import annotations

import json
import os
import stat

import pytest

from execbox.boxes import build_box, build_sources, bwrap, runtime, runtime_build
from execbox.boxes.runtime import RuntimeNotUsable

REGISTRY = "http://mirror.example:8080/npm"


def _lock(work, packages: dict) -> None:
    (work / "node_modules").mkdir(parents=True, exist_ok=True)
    (work / "node_modules" / ".package-lock.json").write_text(json.dumps({"lockfileVersion": 3,
                                                                          "packages": packages}))


def _from_registry(name: str, deps: dict | None = None) -> dict:
    return {"version": "1.0.0", "resolved": f"http://mirror.example:8080/npm/-/{name}-1.0.0.tgz",
            "integrity": "sha512-x", **({"dependencies": deps} if deps else {})}


def test_npm_packages_from_the_registry_pass(tmp_path):
    _lock(tmp_path, {"node_modules/axios": _from_registry("axios", {"form-data": "^4.0.0", "proxy": "latest",
                                                                   "alias": "npm:@scope/real@~1.2 || >=2"}),
                     "node_modules/form-data": _from_registry("form-data"),
                     "node_modules/axios/node_modules/inner": {"version": "1.0.0", "inBundle": True}})
    build_sources.check_npm_sources(str(tmp_path), REGISTRY)


@pytest.mark.parametrize("packages, named", [
    ({"node_modules/a": _from_registry("a", {"remote": "http://mirror.example:8080/npm/-/b-1.0.0.tgz"})}, "remote"),
    ({"node_modules/a": _from_registry("a", {"local": "file:/tmp/secret"})}, "local"),
    ({"node_modules/a": _from_registry("a", {"gh": "user/repo"})}, "gh"),
    ({"node_modules/a": _from_registry("a", {"g": "git+ssh://git@github.com/x/y.git"})}, "g"),
    ({"node_modules/a": _from_registry("a", {"up": "../../up"})}, "up"),
    ({"node_modules/hostdir": {"resolved": "../../tmp/secret", "link": True}}, "hostdir"),
    ({"../../tmp/secret": {"version": "1.0.0"}}, "../../tmp/secret"),
    ({"node_modules/a": {**_from_registry("a"), "resolved": "http://elsewhere.example/a-1.0.0.tgz"}}, "a"),
    ({"node_modules/a": {**_from_registry("a"), "resolved": "http://mirror.example:9999/a-1.0.0.tgz"}}, "a"),
    ({"node_modules/a": {**_from_registry("a"), "resolved": "file:/tmp/a.tgz"}}, "a"),
    ({"node_modules/a": {"version": "1.0.0"}}, "a"),
])
def test_npm_packages_not_from_the_registry_are_refused_naming_them(tmp_path, packages, named):
    _lock(tmp_path, packages)
    with pytest.raises(RuntimeNotUsable) as e:
        build_sources.check_npm_sources(str(tmp_path), REGISTRY)
    assert e.value.code == "SB002" and named in e.value.message and e.value.details["dependency"] == named


def test_a_missing_or_odd_npm_record_is_refused(tmp_path):
    with pytest.raises(RuntimeNotUsable, match="unreadable"):
        build_sources.check_npm_sources(str(tmp_path), None)
    (tmp_path / "node_modules").mkdir()
    os.symlink("/etc/passwd", tmp_path / "node_modules" / ".package-lock.json")
    with pytest.raises(RuntimeNotUsable, match="unreadable"):
        build_sources.check_npm_sources(str(tmp_path), None)


def test_a_distribution_installed_from_a_direct_url_is_refused(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "good-1.0.dist-info").mkdir(parents=True)
    build_sources.check_pip_sources(str(tmp_path))
    (site / "evil-1.0.dist-info").mkdir()
    (site / "evil-1.0.dist-info" / "direct_url.json").write_text('{"url": "http://x/evil.tar.gz"}')
    with pytest.raises(RuntimeNotUsable, match="evil-1.0 from a direct URL"):
        build_sources.check_pip_sources(str(tmp_path))


def test_what_the_box_answers_is_checked():
    refused = {"ok": False, "tool": "pip", "refused": {"requirement": "evil @ http://x/e.tar.gz", "of": "dep"}}
    with pytest.raises(RuntimeNotUsable, match="dep depends on 'evil @ http://x/e.tar.gz', a direct URL") as e:
        build_box._outcome({"result": {"present": True, "json": json.dumps(refused)}}, 60,
                           "https://user.example/simple/")
    assert "https://user.example/…" in e.value.message and e.value.details["dependency"] == "evil @ http://x/e.tar.gz"
    failed = {"ok": False, "tool": "npm", "exit_code": 1, "tail": ["npm error 404 nope"]}
    with pytest.raises(RuntimeNotUsable, match="npm failed:\nnpm error 404 nope"):
        build_box._outcome({"result": {"present": True, "json": json.dumps(failed)}}, 60, None)
    with pytest.raises(RuntimeNotUsable, match="within 60s"):
        build_box._outcome({"timed_out": True, "result": None}, 60, None)
    with pytest.raises(RuntimeNotUsable, match="build box failed: Traceback"):
        build_box._outcome({"exit_code": 1, "stderr": "Traceback", "result": None}, 60, None)
    build_box._outcome({"result": {"present": True, "json": '{"ok": true}'}}, 60, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_own_tree_takes_everything_back_without_following_links(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("x")
    work = tmp_path / "v"
    (work / "d").mkdir(parents=True)
    (work / "d" / "f").write_text("y")
    os.chmod(work / "d" / "f", 0o4755)
    os.symlink(str(outside), work / "d" / "link")
    os.symlink(str(tmp_path), work / "dirlink")
    os.mkfifo(work / "d" / "fifo")
    build_box.own_tree(str(work), 12345)
    assert os.lstat(work / "d" / "f").st_uid == 12345 and os.lstat(work / "d" / "link").st_uid == 12345
    assert os.stat(outside).st_uid == 0 and os.stat(tmp_path).st_uid == 0  # link targets untouched
    assert stat.S_IMODE(os.stat(work / "d" / "f").st_mode) == 0o755  # set-id bits dropped
    assert not os.path.lexists(work / "d" / "fifo")
    build_box.own_tree(str(work), 0)
    assert os.lstat(work / "d" / "f").st_uid == 0 and os.stat(work).st_uid == 0


def test_the_writable_runtime_is_only_the_build_s(tmp_path):
    rt = runtime.Runtime("t", "/opt/execbox/runtime/bin/python", str(tmp_path))
    spec = bwrap.BoxSpec(runtime=rt, agent_root="/j/agent", etc_dir="/j/etc", env={}, agent_limits={},
                         seccomp_fd=None, extra_ro=[("/j/pip", "/opt/execbox/pip")])
    argv = bwrap.build_argv(spec)
    assert argv[argv.index(str(tmp_path)) - 1] == "--ro-bind"
    spec.writable_runtime = True
    argv = bwrap.build_argv(spec)
    assert argv[argv.index(str(tmp_path)) - 1] == "--bind" and argv[argv.index("/j/pip") - 1] == "--ro-bind"


def test_no_box_means_no_build_and_never_pip_on_the_host(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    monkeypatch.setattr(bwrap, "bwrap_path", lambda: None)
    started: list = []
    real_popen = subprocess.Popen

    def popen(argv, *a, **kw):  # the venv is made on the host; nothing else may start there
        started.append(argv)
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(RuntimeNotUsable, match="bubblewrap") as e:
        runtime_build.build("nobox", pip=["anything"], npm=["other"])
    assert e.value.details["missing"] == "bwrap"
    assert not started  # refused before any work: not even the venv was made
    assert not runtime.versions("nobox")
    assert not os.path.isdir(tmp_path / "runtimes" / "nobox")


@pytest.mark.skipif(os.geteuid() != 0, reason="a build box needs root (box networking)")
def test_a_mirror_on_the_host_s_loopback_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    monkeypatch.setattr(bwrap, "bwrap_path", lambda: "/usr/bin/bwrap")
    for kw in ({"pip": ["x"], "index_url": "http://127.0.0.1:8080/simple"},
               {"npm": ["x"], "registry": "http://localhost:4873/"}):
        with pytest.raises(RuntimeNotUsable, match="loopback, which a build box cannot reach"):
            runtime_build.build("lo", **kw)
    assert not os.path.isdir(tmp_path / "runtimes" / "lo")


def test_a_from_parent_s_records_are_checked_only_where_the_build_changed_them(tmp_path):
    parent = {"node_modules/old": {"version": "1.0.0", "resolved": "https://other-registry.example/old-1.0.0.tgz"}}
    _lock(tmp_path, {**parent, "node_modules/new": _from_registry("new")})
    build_sources.check_npm_sources(str(tmp_path), REGISTRY, before=parent)  # the parent's, as it was
    with pytest.raises(RuntimeNotUsable, match="old came from"):
        build_sources.check_npm_sources(str(tmp_path), REGISTRY)
    _lock(tmp_path, {"node_modules/old": {**parent["node_modules/old"], "version": "2.0.0"}})
    with pytest.raises(RuntimeNotUsable, match="old came from"):  # changed by this build: checked
        build_sources.check_npm_sources(str(tmp_path), REGISTRY, before=parent)
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "inherited-1.0.dist-info").mkdir(parents=True)
    (site / "inherited-1.0.dist-info" / "direct_url.json").write_text("{}")
    before = build_sources.direct_url_records(str(tmp_path))
    build_sources.check_pip_sources(str(tmp_path), before)
    (site / "added-1.0.dist-info").mkdir()
    (site / "added-1.0.dist-info" / "direct_url.json").write_text("{}")
    with pytest.raises(RuntimeNotUsable, match="added-1.0"):
        build_sources.check_pip_sources(str(tmp_path), before)


def test_a_build_box_that_does_not_end_is_never_walked_by_the_host(tmp_path, monkeypatch):
    """own_tree runs as root over what the box wrote: a box process still alive could swap a checked
    path for a link to a host file, so the version is taken back only once every process is reaped."""
    from execbox.boxes import jail_box, netns

    class Box:
        class client:  # noqa: N801 - the shape jail boxes have
            @staticmethod
            def call(*_a, **_kw):
                return {"exit_code": 0, "result": {"ok": True}}

        @staticmethod
        def destroy():
            pass

    walked = []
    monkeypatch.setattr(build_box, "box_prerequisites", lambda *a, **kw: "")
    monkeypatch.setattr(jail_box, "start", lambda *a, **kw: Box())
    monkeypatch.setattr(jail_box, "reap_stale", lambda *a, **kw: None)
    monkeypatch.setattr(netns, "reap_stale_once", lambda *a, **kw: None)
    monkeypatch.setattr(build_box, "own_tree", lambda *a, **kw: walked.append(a))
    monkeypatch.setattr(jail_box, "drain", lambda timeout=30.0: False)
    with pytest.raises(RuntimeNotUsable, match="did not all end"):
        build_box.install_in_box(str(tmp_path), ["pkg"], [], python="/usr/bin/python3", index_url=None,
                                 registry=None, report=lambda *a: None)
    assert walked == []
