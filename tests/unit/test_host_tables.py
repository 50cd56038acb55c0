"""fs.file-max: raised to its maximum by a root service that finds it lower (one tenant's boxes
filled the host's open-file table for everyone), left alone otherwise, reported by doctor."""

from __future__ import annotations

import logging

import pytest

from execbox.boxes import host_tables


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "file-max"
    path.write_text("2466183\n")
    monkeypatch.setattr(host_tables.os, "geteuid", lambda: 0)
    return path


def test_a_root_service_raises_a_low_file_max_to_the_kernels_ceiling(table, caplog):
    with caplog.at_level(logging.INFO, "execbox.host"):
        assert host_tables.raise_file_max(str(table)) == (2466183, 2**63 - 1)
    assert table.read_text() == str(2**63 - 1)
    assert "raised fs.file-max from 2466183" in caplog.text


def test_a_higher_value_and_a_non_root_service_are_left_alone(table, monkeypatch):
    table.write_text(f"{2**63 - 1}\n")
    assert host_tables.raise_file_max(str(table)) == (2**63 - 1, 2**63 - 1)
    table.write_text("1000\n")
    monkeypatch.setattr(host_tables.os, "geteuid", lambda: 1000)
    assert host_tables.raise_file_max(str(table)) == (1000, 1000)
    assert table.read_text() == "1000\n"


def test_a_table_that_cannot_be_written_is_a_warning_with_the_command(table, monkeypatch, caplog):
    def read_only(path, mode="r", **kw):
        if "w" in mode:
            raise PermissionError(30, "Read-only file system")
        return open_(path, mode, **kw)

    open_ = open
    monkeypatch.setattr("builtins.open", read_only)
    with caplog.at_level(logging.WARNING, "execbox.host"):
        assert host_tables.raise_file_max(str(table)) == (2466183, 2466183)
    assert "sysctl -w fs.file-max=9223372036854775807" in caplog.text


def test_doctor_flags_a_table_box_memory_could_fill(table, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree: 1 kB\n")
    low = host_tables.file_max_check(str(table), str(meminfo))
    assert low["ok"] is False and "one tenant can exhaust" in low["detail"]
    table.write_text(f"{2**63 - 1}\n")
    assert host_tables.file_max_check(str(table), str(meminfo))["ok"] is True


def test_pty_max_leaves_the_host_its_share_with_every_box_at_its_cap(tmp_path, monkeypatch):
    """Boxes' devpts instances are mounted from the host's namespace and may use the reserve the
    host keeps for its logins: kernel.pty.max must hold every box uid at its cap plus that."""
    monkeypatch.setattr(host_tables.os, "geteuid", lambda: 0)
    path = tmp_path / "pty-max"
    path.write_text("4096\n")
    assert host_tables.raise_pty_max(4096, str(path)) == (4096, 4096 * 64 + 4096)
    assert host_tables.pty_max_check(4096, str(path))["ok"] is True
    assert host_tables.pty_max_check(8192, str(path))["ok"] is False
    assert host_tables.pty_max_target(100_000) == 1 << 20  # the kernel refuses more
    path.write_text("2000000\n")
    assert host_tables.raise_pty_max(4096, str(path)) == (2000000, 2000000)  # never lowered
