"""The box's /etc is one staged directory (bwrap.staged_etc): complete, world-readable, and
re-staged (never rewritten) when the host's entries change."""

from __future__ import annotations

import os
import stat

import pytest

from execbox.boxes import bwrap


@pytest.fixture
def host_etc(tmp_path, monkeypatch):
    etc = tmp_path / "host-etc"
    (etc / "ld.so.conf.d").mkdir(parents=True)
    (etc / "ld.so.conf.d" / "x86_64-linux-gnu.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    (etc / "ld.so.cache").write_bytes(b"\x00cache-v1")
    (etc / "alternatives").mkdir()
    (etc / "alternatives" / "awk").symlink_to("/usr/bin/mawk")
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    # mime.types and ld.so.conf absent: skipped, as --ro-bind-try skipped them
    monkeypatch.setattr(bwrap, "HOST_ETC", str(etc))
    monkeypatch.setenv("EXECBOX_JAIL_DIR", str(tmp_path / "jail"))
    monkeypatch.setattr(bwrap, "_staged_etc", {})
    return etc


def test_staged_etc_holds_the_synthetic_files_and_copies_of_the_host_entries(host_etc):
    d = bwrap.staged_etc()
    assert os.path.basename(d).startswith("box-etc-")
    assert open(os.path.join(d, "passwd")).read() == bwrap.ETC_FILES["passwd"]
    assert open(os.path.join(d, "ld.so.cache"), "rb").read() == b"\x00cache-v1"
    assert os.readlink(os.path.join(d, "alternatives", "awk")) == "/usr/bin/mawk"
    assert os.readlink(os.path.join(d, "localtime")) == "/usr/share/zoneinfo/Etc/UTC"
    assert os.path.isfile(os.path.join(d, "ld.so.conf.d", "x86_64-linux-gnu.conf"))
    assert not os.path.exists(os.path.join(d, "mime.types"))
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            assert stat.S_ISLNK(st.st_mode) or st.st_mode & 0o004, name  # the box's uid reads it
    assert not [n for n in os.listdir(os.path.dirname(d)) if ".tmp-" in n]
    assert bwrap.staged_etc() == d  # unchanged host: the same directory


def test_a_host_change_stages_a_new_directory_and_leaves_the_old_one_whole(host_etc):
    old = bwrap.staged_etc()
    (host_etc / "ld.so.cache").write_bytes(b"\x00cache-v2, longer")  # ldconfig after an install
    new = bwrap.staged_etc()
    assert new != old
    assert open(os.path.join(new, "ld.so.cache"), "rb").read() == b"\x00cache-v2, longer"
    assert open(os.path.join(old, "ld.so.cache"), "rb").read() == b"\x00cache-v1"  # a running box's /etc


def test_variants_differ_by_files_and_mount_points(host_etc):
    plain = bwrap.staged_etc()
    net = bwrap.staged_etc("box-etc-net", {**bwrap.ETC_FILES, "resolv.conf": "nameserver 198.18.255.1\n"},
                           mount_points=("ssl/certs",))
    assert net != plain
    assert os.path.isdir(os.path.join(net, "ssl", "certs")) and not os.listdir(os.path.join(net, "ssl", "certs"))
    assert not os.path.exists(os.path.join(plain, "resolv.conf"))


def test_the_box_binds_the_staged_directory_as_its_only_etc_mount():
    spec = bwrap.BoxSpec(runtime=bwrap.Runtime("system", "/usr/bin/python3"), agent_root="/j/agent/abc",
                         etc_dir="/j/box-etc-0123", env={}, agent_limits={}, seccomp_fd=None)
    argv = bwrap.build_argv(spec)
    etc = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv[:-2])
           if a.startswith("--") and "bind" in a and argv[i + 2].startswith("/etc")]
    assert etc == [("/j/box-etc-0123", "/etc")]


def test_staging_never_changes_what_a_copied_link_points_at(host_etc, tmp_path):
    """/etc/alternatives holds links to host directories (e.g. ``mpi-x86_64-linux-gnu`` ->
    /usr/lib/x86_64-linux-gnu/openmpi/include). Making the staged copy world-readable must not
    follow them: as root it would chmod the host's directory (found on a host where the
    unprivileged test hit EPERM on exactly that link)."""
    target = tmp_path / "host-dir"
    target.mkdir(mode=0o700)
    os.chmod(target, 0o700)
    (host_etc / "alternatives" / "mpi").symlink_to(target)
    d = bwrap.staged_etc()
    assert os.readlink(os.path.join(d, "alternatives", "mpi")) == str(target)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o700
