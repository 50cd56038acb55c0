"""Runtime references and `execbox runtime rm`: one validator (no empty version, no trailing
newline), the current version only with the whole template, and never what a running box mounts."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from execbox.boxes import runtime, runtime_use
from execbox.cli import app


@pytest.fixture
def tpl(tmp_path, monkeypatch):
    """Template ``tpl`` with v1 and v2 (current) in a private jail dir."""
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path))
    top = tmp_path / "runtimes" / "tpl"
    for v in ("v1", "v2"):
        (top / v).mkdir(parents=True)
        (top / v / runtime.MANIFEST).write_text(json.dumps({"packages": [], "npm": []}))
    os.symlink("v2", top / runtime.CURRENT)
    return top


@pytest.mark.parametrize("ref", ["tpl@", "tpl@v", "tpl@v0", "tpl@../..", "tpl@v1\n", "tpl@v1/..", "tpl@@v1",
                                 "tpl@\u0661"])
def test_a_malformed_version_is_sb002_and_removes_nothing(tpl, ref):
    with pytest.raises(runtime.RuntimeNotUsable) as e:
        runtime.remove(ref)
    assert e.value.code == "SB002" and e.value.http_status == 400
    assert "give NAME or NAME@vN" in e.value.message
    assert runtime.versions("tpl") == ["v1", "v2"] and runtime.current_version("tpl") == "v2"
    with pytest.raises(runtime.RuntimeNotUsable, match="give NAME or NAME@vN"):
        runtime.resolve(ref)  # the same validator: no silent fallback to the current version


def test_cli_rm_with_an_empty_version_keeps_the_template(tpl):
    res = CliRunner().invoke(app, ["runtime", "rm", "tpl@"])
    assert res.exit_code == 2 and "SB002" in res.output and "give NAME or NAME@vN" in res.output, res.output
    assert runtime.versions("tpl") == ["v1", "v2"]


@pytest.mark.parametrize("name", ["bad\n", "tpl\n", "a" * 64, "../x", "Tpl", ""])
def test_a_name_with_a_trailing_newline_or_bad_chars_is_refused(tpl, name):
    with pytest.raises(runtime.RuntimeNotUsable):
        runtime.check_name(name)
    res = CliRunner().invoke(app, ["runtime", "build", name])
    assert res.exit_code == 2 and "SB002" in res.output, res.output
    assert sorted(os.listdir(tpl.parent)) == ["tpl"]  # no directory was made for it


def test_versions_are_parsed_once(tpl):
    assert runtime.parse_ref("tpl") == ("tpl", None)
    assert runtime.parse_ref("tpl@v1") == ("tpl", "v1") == runtime.parse_ref("tpl@1")
    assert runtime.resolve("tpl@1").version == "v1" and runtime.resolve("tpl").version == "v2"


def test_old_version_and_whole_template_are_removed_when_unused(tpl, monkeypatch):
    monkeypatch.setattr(runtime_use, "boxes_using", lambda dirs: [])
    with pytest.raises(runtime.RuntimeNotUsable, match="current version"):
        runtime.remove("tpl@v2")
    assert runtime.remove("tpl@v1") and runtime.versions("tpl") == ["v2"]
    assert runtime.remove("tpl@v1") is False  # gone
    assert runtime.remove("tpl") and not tpl.exists()
    assert not [n for n in os.listdir(tpl.parent) if n.startswith(".rm-")]


def test_a_version_in_use_is_refused_naming_it_unless_forced(tpl, monkeypatch):
    seen: list[list[str]] = []

    def using(dirs):
        seen.append(list(dirs))
        return [4242] if any(d.endswith("v1") for d in dirs) else []

    monkeypatch.setattr(runtime_use, "boxes_using", using)
    with pytest.raises(runtime.RuntimeNotUsable) as e:
        runtime.remove("tpl@v1")
    assert e.value.code == "SB002" and e.value.http_status == 409
    assert "tpl@v1 is in use" in e.value.message and "4242" in e.value.message and "--force" in e.value.message
    assert runtime.versions("tpl") == ["v1", "v2"]
    with pytest.raises(runtime.RuntimeNotUsable, match="tpl is in use"):
        runtime.remove("tpl")  # the whole template holds v1
    assert any(d.endswith("/tpl/v1") for d in seen[-1])
    res = CliRunner().invoke(app, ["runtime", "rm", "tpl@v1"])
    assert res.exit_code == 2 and "in use" in res.output, res.output
    res = CliRunner().invoke(app, ["runtime", "rm", "tpl@v1", "--force"])
    assert res.exit_code == 0, res.output
    assert runtime.versions("tpl") == ["v2"]


def test_a_box_that_started_during_the_removal_keeps_its_version(tpl, monkeypatch):
    answers = iter([[], [77]])  # free when first checked, in use once renamed away
    monkeypatch.setattr(runtime_use, "boxes_using", lambda dirs: next(answers))
    with pytest.raises(runtime.RuntimeNotUsable, match="in use"):
        runtime.remove("tpl@v1")
    assert runtime.versions("tpl") == ["v1", "v2"]  # put back under its name
    assert not [n for n in os.listdir(tpl) if n.startswith(".rm-")]


def test_a_removed_version_is_a_clear_error_at_box_start(tpl, monkeypatch):
    monkeypatch.setattr(runtime_use, "boxes_using", lambda dirs: [])
    pinned = runtime.resolve("tpl@v1")
    assert pinned.mounts() == [(str(tpl / "v1"), runtime.RUNTIME_MOUNT)]
    runtime.remove("tpl@v1")
    with pytest.raises(runtime.RuntimeNotUsable, match="tpl@v1 was removed"):
        pinned.mounts()


def test_boxes_using_matches_the_mounted_directory_not_a_symlink(tmp_path):
    """A fake /proc: pid 10's root has the version at the mount point (as a bind mount shows
    it), pid 11's root has a symlink to it there, pid 12 shares pid 10's mount namespace."""
    version = tmp_path / "fakeroot" / runtime.RUNTIME_MOUNT.lstrip("/")
    version.mkdir(parents=True)
    other = tmp_path / "other" / "v9"
    other.mkdir(parents=True)
    link_root = tmp_path / "linkroot" / os.path.dirname(runtime.RUNTIME_MOUNT).lstrip("/")
    link_root.mkdir(parents=True)
    os.symlink(version, link_root / os.path.basename(runtime.RUNTIME_MOUNT))
    proc = tmp_path / "proc"
    for pid, root, ns in (("10", tmp_path / "fakeroot", "mnt:[1]"), ("11", tmp_path / "linkroot", "mnt:[2]"),
                          ("12", tmp_path / "fakeroot", "mnt:[1]"), ("13", tmp_path / "nothing", "mnt:[3]")):
        (proc / pid / "ns").mkdir(parents=True)
        os.symlink(root, proc / pid / "root")
        os.symlink(ns, proc / pid / "ns" / "mnt")
    (proc / "self").mkdir()
    assert runtime_use.boxes_using([str(version)], str(proc)) == [10]  # one box, not two pids
    assert runtime_use.boxes_using([str(other)], str(proc)) == []
    assert runtime_use.boxes_using([str(tmp_path / "missing")], str(proc)) == []


@pytest.mark.parametrize(("pip", "npm"), [(["smallpkg\n"], []), (["smallpkg==1.0\n"], []), ([], ["axios\n"]),
                                          ([], ["axios@1\n"]), (["smallpkg\nother"], [])])
def test_a_requirement_with_a_newline_is_refused(pip, npm):
    from execbox.boxes.runtime_build import check_specs

    with pytest.raises(runtime.RuntimeNotUsable, match="invalid") as e:
        check_specs(pip, npm)
    assert e.value.code == "SB002" and e.value.details["field"] == ("pip" if pip else "npm")
    check_specs(["smallpkg", "smallpkg[x]>=1,<2"], ["axios", "@scope/pkg@^1.2"])  # the valid forms pass
