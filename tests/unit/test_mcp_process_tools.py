"""The MCP background-process tools' pieces that need no box: arguments refused before dispatch
(SB002 naming the field) and a capped read of a process's buffered output, which must cut on a
character boundary and give offsets that lose and repeat nothing."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.errors import SandboxError
from execbox.mcp import processes
from execbox.mcp.arguments import check_arguments
from execbox.mcp.tools import BY_NAME
from execbox.service.background import BgProcess

BAD = [  # (tool, arguments, the field the SB002 error must name, the schema keyword it broke)
    ("start_process", {}, "command", "required"),
    ("start_process", {"command": "x", "timeout": 0}, "timeout", "exclusiveMinimum"),
    ("start_process", {"command": "x", "timeout": 10**6}, "timeout", "maximum"),
    ("start_process", {"command": "x", "env": {"A": 1}}, "env", "type"),
    ("start_process", {"command": "x", "wait": 61}, "wait", "maximum"),
    ("read_process_output", {"pid": 0}, "pid", "minimum"),
    ("read_process_output", {"pid": "12"}, "pid", "type"),
    ("read_process_output", {"pid": 3, "stdout_offset": -1}, "stdout_offset", "minimum"),
    ("read_process_output", {"pid": 3, "cursor": 5}, "cursor", "additionalProperties"),
    ("write_process_input", {"pid": 3, "encoding": "latin-1"}, "encoding", "enum"),
    ("kill_process", {"pid": 3, "signal": "SIGSTOP"}, "signal", "enum"),
    ("kill_process", {}, "pid", "required"),
    ("move_file", {"source": "a"}, "destination", "required"),
    ("delete_file", {"path": ""}, "path", "minLength"),
    ("create_directory", {"path": "d", "session_id": "../x"}, "session_id", "pattern"),
    ("interrupt_run", {"context_id": "c"}, "context_id", "additionalProperties"),
]


@pytest.mark.parametrize(("tool", "args", "field", "keyword"), BAD)
def test_bad_arguments_are_sb002_naming_the_field(tool: str, args: dict[str, Any], field: str, keyword: str) -> None:
    with pytest.raises(SandboxError) as caught:
        check_arguments(tool, BY_NAME[tool].input_schema, args)
    e = caught.value
    assert e.code == "SB002" and e.details["field"] == field and e.details["constraint"] == keyword


def _proc(stdout: bytes, ended: bool) -> BgProcess:
    p = BgProcess(7, "cmd", None, "t", "s", None, "box", False, None)  # type: ignore[arg-type]  # no box read
    p.out.buf += stdout
    p.ended = ended
    return p


@pytest.mark.parametrize("ended", [False, True])
def test_a_capped_read_cuts_on_characters_and_its_offsets_lose_nothing(ended: bool) -> None:
    text = "é€😀x" * 50  # 2-, 3- and 4-byte characters
    p = _proc(text.encode(), ended)
    offset, parts = 0, []
    for _ in range(100):
        got = processes.read(p, offset, 0, 0, 7)
        assert len(got["stdout"].encode()) <= 7 and "\ufffd" not in got["stdout"]
        parts.append(got["stdout"])
        assert got["stdout_waiting"] == len(text.encode()) - got["stdout_offset"]
        if got["stdout_offset"] == offset:
            break
        offset = got["stdout_offset"]
    assert "".join(parts) == text and offset == len(text.encode())
    assert got["running"] is (not ended)


def test_a_read_waits_for_output_until_its_wait_ends() -> None:
    import time

    p = _proc(b"", False)
    started = time.monotonic()
    got = processes.read(p, 0, 0, 0.3, 100)
    assert got["stdout"] == "" and 0.25 <= time.monotonic() - started < 2
