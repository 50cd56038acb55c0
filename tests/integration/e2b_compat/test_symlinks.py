"""Symlinks through E2B's file API: reported as links (type SYMLINK, ``symlink_target``, the
link's own size), never followed, a target inside the workspace named as the sandbox sees it."""

from __future__ import annotations

import pytest

from .conftest import Server

e2b = pytest.importorskip("e2b")


def test_get_info_and_list_report_symlinks(e2b_env: Server) -> None:
    sbx = e2b.Sandbox.create(timeout=60)
    try:
        r = sbx.commands.run("echo hello > w1.txt && mkdir -p d && ln -s w1.txt link.txt && "
                             "ln -s /etc/passwd out && ln -s ../w1.txt d/up")
        assert r.exit_code == 0, r.stderr
        info = sbx.files.get_info("/home/user/link.txt")
        assert (info.type, info.symlink_target, info.size) == (e2b.FileType.SYMLINK, "/home/user/w1.txt", 6)
        assert sbx.files.get_info("/home/user/d/up").symlink_target == "/home/user/w1.txt"
        assert sbx.files.get_info("/home/user/out").symlink_target == "/etc/passwd"  # the text, not followed
        plain = sbx.files.get_info("/home/user/w1.txt")
        assert (plain.type, plain.symlink_target) == (e2b.FileType.FILE, None)
        listed = {e.name: e for e in sbx.files.list("/home/user")}
        assert listed["link.txt"].type == e2b.FileType.SYMLINK and listed["d"].type == e2b.FileType.DIR
    finally:
        sbx.kill()
