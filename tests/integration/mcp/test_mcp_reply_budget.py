"""Every MCP tool result fits a budget derived from EXECBOX_MCP_MAX_OUTPUT (review 31, F3), on a
real `execbox serve` (jail boxes), text and structured content alike, and says exactly how to get
the rest:

- read_file of one 3 MB line gave 3 M characters (its `limit` counts lines): now a page holds at
  most the cap and a line at most `max_line_chars`; the cut names the `offset` / `char_offset` that
  read on, and following those reassembles the file exactly;
- list_files (recursive) and glob gave hundreds of K characters: now they say how many entries
  were left out and how to narrow the listing;
- main()'s return value was uncapped in structuredContent: now it is capped like stdout.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from execbox.mcp.output_cap import DEFAULT_MAX_OUTPUT
from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

B = DEFAULT_MAX_OUTPUT
SLACK = 1000  # a note and the structured fields around the capped part

SETUP = r"""
import os
line = ''.join(chr(48 + i % 10) for i in range(40_000))
open('one_line.txt', 'w').write(line + '\n')            # 40 000 characters on one line
open('big.txt', 'w').write('z' * 3_000_000)               # 3 MB, no newline at all
open('rows.txt', 'w').write(''.join(f'row {i:05d} ' + 'x' * 90 + '\n' for i in range(5000)))  # 500 KB
open('mixed.txt', 'w').write(MIXED)                       # long and short lines (review 32, F1)
for i in range(3000):
    os.makedirs('d/' + 'q' * 150 + str(i))
print('ok')
"""
MIXED = ("short0\n" + "A" * 5000 + "\n" + "B" * 100 + "\n" + "C" * 5000 + "\nshort4\n"
         + "".join(f"{i:03d} " + "y" * (i * 1237 % 9000) + "\n" + "s\n" * (i % 3) for i in range(120)) + "end")


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def _size(result: Any) -> int:
    return len(json.dumps(result.structured_content, ensure_ascii=False))


def _within(result: Any, limit: int = B + SLACK) -> None:
    assert not result.is_error, _text(result)
    assert len(_text(result)) <= limit, len(_text(result))
    assert _size(result) <= limit + 2 * SLACK, _size(result)


def test_every_file_tool_reply_fits_the_budget_and_says_how_to_read_on(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]

            async def call(name: str, **args: Any) -> Any:
                return await c.call_tool(name, {"session_id": sid, **args})

            setup = f"MIXED = {MIXED!r}\n{SETUP}"
            assert (await call("run_code", code=setup)).structured_content["stdout"] == "ok\n"
            out: dict[str, Any] = {"big": await call("read_file", path="big.txt", limit=1),
                                   "list": await call("list_files", recursive=True),
                                   "glob": await call("glob", pattern="**/*", max_results=10000),
                                   "grep": await call("grep", pattern="row", max_results=10000),
                                   "result": await call("run_code", code="def main():\n    return 'y' * 500_000\n",
                                                        arguments={})}
            pieces, args, calls = [], {"path": "one_line.txt"}, 0  # follow the notes through a long line
            while True:
                r = await call("read_file", **args)
                _within(r)
                calls += 1
                pieces.append(r.structured_content["content"])
                assert "[..." not in r.structured_content["content"]
                cut = r.structured_content.get("cut_lines")
                if not cut:
                    break
                m = re.search(r"read on with offset=(\d+) char_offset=(\d+)\]", _text(r))
                assert m and int(m[2]) == cut[0]["next_char_offset"], _text(r)
                args = {"path": "one_line.txt", "offset": int(m[1]), "char_offset": int(m[2])}
            out["line_pieces"], out["line_calls"] = pieces, calls
            pages, args = [], {"path": "rows.txt"}  # follow the page notes through 500 KB of lines
            while True:
                r = await call("read_file", **args)
                _within(r)
                pages.append(r.structured_content["content"])
                m = re.search(r"read on with offset=(\d+)\]", _text(r))
                if not m:
                    break
                assert r.structured_content["next_offset"] == int(m[1])
                args = {"path": "rows.txt", "offset": int(m[1])}
            out["pages"] = pages
            mixed: list[str] = []  # follow only the one note of each reply through long and short lines
            args = {"path": "mixed.txt"}
            while True:
                r = await call("read_file", **args)
                _within(r)
                sc, text = r.structured_content, _text(r)
                mixed.append(sc["content"])
                notes = re.findall(r"read on with offset=(\d+)(?: char_offset=(\d+))?\]", text)
                assert len(notes) <= 1 and "[..." not in sc["content"], text[-300:]
                if not notes:
                    assert "next_offset" not in sc
                    break
                line, char = int(notes[0][0]), int(notes[0][1] or 0)
                assert (sc["next_offset"], sc.get("next_char_offset", 0)) == (line, char)
                args = {"path": "mixed.txt", "offset": line, "char_offset": char}
            out["mixed"] = mixed
            out["wide"] = await call("read_file", path="one_line.txt", max_line_chars=10)
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    big = out["big"]
    _within(big)
    assert big.structured_content["content"] == "z" * 2000  # the data alone; the marker is in the text
    assert _text(big).endswith("z [... 2998000 more characters in this line: read on with offset=0 char_offset=2000]")
    assert (big.structured_content["next_offset"], big.structured_content["next_char_offset"]) == (0, 2000)
    assert big.structured_content["cut_lines"] == [{"line": 0, "characters": 3_000_000, "next_char_offset": 2000}]

    line = "".join(chr(48 + i % 10) for i in range(40_000))
    assert "".join(out["line_pieces"]) == line + "\n" and out["line_calls"] == 20  # 2000 characters a call, none lost
    assert "".join(out["mixed"]) == MIXED and len(out["mixed"]) > 100  # none lost or repeated (review 32, F1)
    rows = "".join(f"row {i:05d} " + "x" * 90 + "\n" for i in range(5000))
    assert "".join(out["pages"]) == rows and len(out["pages"]) > 10  # whole lines, none lost or repeated
    assert out["wide"].structured_content["content"] == "0123456789"
    assert _text(out["wide"]) == ("0123456789 [... 39990 more characters in this line: read on with offset=0 "
                                  "char_offset=10]")

    for name, what in (("list", "entries"), ("glob", "paths")):
        r = out[name]
        _within(r)
        sc = r.structured_content
        shown = len(sc["files"] if name == "list" else sc["paths"])
        assert sc["omitted"] > 2000 and shown + sc["omitted"] >= 3000, (shown, sc["omitted"])
        assert re.search(rf"\[{sc['omitted']} of \d+ {what} not shown: a reply holds at most {B} characters; ",
                         _text(r)), _text(r)[-400:]
    assert out["list"].structured_content["truncated"] is True

    grep = out["grep"]
    _within(grep)
    assert grep.structured_content["omitted"] > 4000 and "results (matching lines" in _text(grep)

    result = out["result"]
    _within(result, 2 * B)
    capped = result.structured_content["output_capped"]["result"]
    assert capped["characters"] == 500_002 and capped["limit"] == B
    assert isinstance(result.structured_content["result"], str) and len(result.structured_content["result"]) < B + SLACK
    assert "characters of result cut here" in _text(result) and "json.dump" in _text(result)
