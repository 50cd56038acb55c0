"""``execbox run``: the program it reads (stdin or a file) is bounded and must be UTF-8, and a
refused program never reaches a sandbox."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from execbox.cli import _exec_json, app


@pytest.fixture
def no_sandbox(monkeypatch):
    ran = []
    monkeypatch.setattr("execbox.sdk.local.execute_code", lambda *a, **k: ran.append(a) or pytest.fail("ran"))
    monkeypatch.setattr(_exec_json, "MAX_REQUEST_BYTES", 64)
    return ran


def _run(argv, stdin=None):
    return CliRunner().invoke(app, argv, input=stdin, env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_a_program_on_stdin_over_the_limit_is_refused_unread(no_sandbox):
    r = _run(["run", "-"], stdin="print(1)\n" * 100)
    assert r.exit_code == 2
    assert "SB002" in r.output and "stdin is larger than the limit of 64 bytes" in r.output
    assert no_sandbox == []


def test_a_program_file_over_the_limit_is_refused(no_sandbox, tmp_path):
    f = tmp_path / "big.py"
    f.write_text("x = 1\n" * 100)
    r = _run(["run", str(f)])
    assert r.exit_code == 2
    assert f"{f} is larger than the limit of 64 bytes" in r.output
    assert no_sandbox == []


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_a_program_that_is_not_utf8_is_sb002_not_a_traceback(no_sandbox, tmp_path, source):
    raw = b"print('\xff')\n"
    if source == "file":
        f = tmp_path / "bad.py"
        f.write_bytes(raw)
        r = _run(["run", str(f)])
    else:
        r = _run(["run", "-"], stdin=raw)
    assert r.exit_code == 2
    assert "SB002" in r.output and "is not UTF-8 text (byte 7)" in r.output
    assert "Traceback" not in r.output
    assert no_sandbox == []
