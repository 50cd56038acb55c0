"""envd's file and process API around the edges: symlinks reported as links (type SYMLINK,
``symlink_target``, the link's own size; never followed), and a command beside a running cell."""

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


def test_the_first_command_runs_beside_a_long_cell(e2b_env: Server) -> None:
    """A sandbox whose first command comes while a cell runs: the command reaches the box beside
    the run (envd_bg.resolve_box) instead of queueing behind the cell."""
    import threading

    ci = pytest.importorskip("e2b_code_interpreter")
    sbx = ci.Sandbox.create(timeout=60)
    try:
        started = threading.Event()
        cell = threading.Thread(target=lambda: sbx.run_code("import time\nprint('in', flush=True)\ntime.sleep(8)",
                                                            on_stdout=lambda _m: started.set()))
        cell.start()
        assert started.wait(30)
        assert sbx.commands.run("echo beside").stdout == "beside\n"
        assert cell.is_alive()  # answered while the cell still sleeps
        cell.join(30)
    finally:
        sbx.kill()


def test_metadata_and_envs_are_bounded(e2b_env: Server) -> None:
    """Every replica reads a sandbox's row: its metadata and env vars are kept small (16 KiB each)."""
    big = {"k": "x" * 20000}
    for kwargs in ({"metadata": big}, {"envs": big}):
        with pytest.raises(e2b.SandboxException, match="larger than 16384 bytes"):
            e2b.Sandbox.create(timeout=30, **kwargs)
    ok = e2b.Sandbox.create(timeout=30, metadata={"k": "x" * 10000})
    ok.kill()
