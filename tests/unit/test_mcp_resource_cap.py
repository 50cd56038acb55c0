"""The resources/read limit (mcp/resource_cap.py, server._read_resource) without a box: the setting's
parsing, the size decision on a provider that does not tell a file's size, and the advice's quoting."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from execbox.errors import InvalidConfigError
from execbox.mcp.core import Caller
from execbox.mcp.resource_cap import DEFAULT_MAX_RESOURCE_BYTES, ENV, how_to_read, max_resource_bytes_from_env
from execbox.mcp.server import _read_resource

MIB = 1024 * 1024


@pytest.mark.parametrize(("raw", "expected"), [("", 4 * MIB), ("  ", 4 * MIB), ("1024", 1024), (" 2048 ", 2048),
                                               ("0", 64 * MIB), (str(64 * MIB), 64 * MIB)])
def test_the_setting(monkeypatch, raw: str, expected: int) -> None:
    monkeypatch.setenv(ENV, raw)
    assert max_resource_bytes_from_env() == expected
    assert DEFAULT_MAX_RESOURCE_BYTES == 4 * MIB


@pytest.mark.parametrize("raw", ["lots", "-1", "4MiB", "1.5", str(64 * MIB + 1)])
def test_a_bad_setting_is_sb002_naming_it(monkeypatch, raw: str) -> None:
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(InvalidConfigError, match=ENV) as e:
        max_resource_bytes_from_env()
    assert e.value.code == "SB002" and e.value.details["field"] == ENV


class _Core:
    """A core whose provider returns plain bytes (no ``total_size``), counting what it reads."""

    def __init__(self, files: dict[str, bytes], limit: int) -> None:
        self.files = files
        self.max_resource_bytes = limit
        self.reads: list[tuple[int | None, int | None]] = []

    def read_bytes(self, caller: Caller, sid: str, path: str, offset: int | None = None,
                   length: int | None = None) -> bytes:
        self.reads.append((offset, length))
        data = self.files[path][offset or 0:]
        return data if length is None else data[:length]


def test_a_provider_that_does_not_tell_the_size_is_never_cut_short() -> None:
    core: Any = _Core({"under.txt": b"u" * 99, "exact.txt": b"e" * 100, "over.txt": b"o" * 101}, 100)
    uri = "execbox://sessions/s1/files/"
    assert _read_resource(core, Caller("t"), uri + "under.txt").contents[0].text == "u" * 99
    assert _read_resource(core, Caller("t"), uri + "exact.txt").contents[0].text == "e" * 100
    with pytest.raises(MCPError) as e:
        _read_resource(core, Caller("t"), uri + "over.txt")
    assert "more than 100 bytes" in e.value.error.message and e.value.error.data["size"] is None
    assert all(length is not None and length <= 100 for _, length in core.reads), core.reads


def test_the_split_advice_quotes_odd_names() -> None:
    tool, how = how_to_read("s1", "my dir/it's.bin", 4096, text=False)
    command = re.search(r"`(split [^`]+)`", how).group(1)
    assert tool == "run_command"
    assert shlex.split(command) == ["split", "-b", "4096", "-d", "-a", "3", "my dir/it's.bin", "my dir/it's.bin.part-"]
