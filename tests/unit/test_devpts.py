"""The per-box devpts mount (boxes/devpts.py) where it cannot be made: not root, or a root that
may not mount. The box then gets bwrap's own instance, as before; nothing is left in its dir.
The real mounts are tests/integration/jail/test_jail_ptys.py and test_pty_exhaustion.py."""

from __future__ import annotations

import ctypes
import errno
import logging
import os

import pytest

from execbox.boxes import devpts


class FakeLibc:
    def __init__(self, err: int = 0) -> None:
        self.err = err
        self.calls: list[tuple] = []

    def mount(self, *args) -> int:
        self.calls.append(("mount", *args))
        if self.err:
            ctypes.set_errno(self.err)
            return -1
        return 0

    def umount2(self, *args) -> int:
        self.calls.append(("umount2", *args))
        return 0


@pytest.fixture
def libc(monkeypatch):
    monkeypatch.setattr(devpts, "_refused", False)
    fake = FakeLibc()
    monkeypatch.setattr(devpts, "_c", lambda: fake)
    return fake


def test_not_root_mounts_nothing_and_unmounts_nothing(libc, tmp_path, monkeypatch):
    monkeypatch.setattr(devpts.os, "geteuid", lambda: 1000)
    assert devpts.mount(str(tmp_path)) is None and devpts.unmount(str(tmp_path)) is True
    assert libc.calls == [] and list(tmp_path.iterdir()) == []


def test_root_mounts_a_capped_instance(libc, tmp_path, monkeypatch):
    monkeypatch.setattr(devpts.os, "geteuid", lambda: 0)
    target = tmp_path / "pty" / "pts"
    assert devpts.mount(str(tmp_path), os.getuid()) == str(target)
    _, source, mounted, fstype, flags, options = libc.calls[0]
    assert (source, mounted, fstype) == (b"devpts", str(target).encode(), b"devpts")
    assert flags == devpts.MS_NOSUID | devpts.MS_NOEXEC
    assert f"max={devpts.PTYS_PER_BOX}".encode() in options.split(b",") and b"ptmxmode=0666" in options
    gate = (tmp_path / "pty").stat()
    assert gate.st_mode & 0o777 == 0o700 and gate.st_uid == os.getuid()  # no other host account gets in
    assert devpts.unmount(str(tmp_path))
    assert libc.calls[1] == ("umount2", str(target).encode(), devpts.MNT_DETACH | devpts.UMOUNT_NOFOLLOW)
    assert list(tmp_path.iterdir()) == []  # both directories go: the box dir's removal is one level deep


def test_a_root_that_may_not_mount_falls_back_once(libc, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(devpts.os, "geteuid", lambda: 0)
    libc.err = errno.EPERM
    with caplog.at_level(logging.WARNING, logger="execbox.boxes.devpts"):
        assert devpts.mount(str(tmp_path)) is None
    assert "without a per-box pty cap" in caplog.text and list(tmp_path.iterdir()) == []
    assert devpts.mount(str(tmp_path)) is None and len(libc.calls) == 1  # not tried again


def test_any_other_mount_failure_fails_the_start(libc, tmp_path, monkeypatch):
    monkeypatch.setattr(devpts.os, "geteuid", lambda: 0)
    libc.err = errno.ENOMEM
    with pytest.raises(OSError) as e:
        devpts.mount(str(tmp_path))
    assert e.value.errno == errno.ENOMEM and list(tmp_path.iterdir()) == []
