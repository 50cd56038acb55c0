"""The budget of an MCP tool result (mcp/budget.py; review 31, F3): pages, lines, listings and the
net under every tool result."""

from __future__ import annotations

import json

import mcp_types as types

from execbox.mcp.budget import cap_page, cap_result, ceiling, fit, fit_json, line_chars
from execbox.mcp.results import execution_result
from execbox.models import ExecutionResult


def test_a_page_keeps_whole_lines_within_the_budget_and_names_the_next_offset() -> None:
    content = "".join(f"{i:03d}\n" for i in range(100))  # 400 characters
    page = cap_page(content, 10, 42, 0)
    assert page.text == "".join(f"{i:03d}\n" for i in range(10)) and page.next_offset == 20
    assert cap_page(content, 0, 0, 0).text == content and cap_page(content, 0, 0, 0).next_offset is None


def test_a_long_line_is_cut_with_the_char_offset_that_reads_on_and_ends_the_page() -> None:
    content = "a" * 50 + "\r\n" + "short\n" + "b" * 30
    page = cap_page(content, 7, 1000, 20)
    assert page.content == "a" * 20 and (page.next_offset, page.next_char_offset) == (7, 20)
    assert page.text == "a" * 20 + " [... 31 more characters in this line: read on with offset=7 char_offset=20]"
    assert page.cut_lines == [{"line": 7, "characters": 51, "next_char_offset": 20}]
    again = cap_page("a" * 50 + "\r\n" + "short\n" + "b" * 30, 7, 1000, 20, char_offset=40)  # the note's call
    assert again.content == "a" * 10 + "\r\nshort\n" + "b" * 20
    assert (again.next_offset, again.next_char_offset) == (9, 20)
    assert again.text.endswith("read on with offset=9 char_offset=20]") and again.text.count("[...") == 1


def _follow(content: str, limit: int, per_line: int, page_lines: int) -> tuple[str, int]:
    """Read ``content`` as a model following the notes does (a core page of ``page_lines`` lines from
    ``offset``, then cap_page), joining the structured ``content`` of each reply."""
    lines = content.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    got, offset, char_offset, calls = [], 0, 0, 0
    while offset < len(lines):
        calls += 1
        page = cap_page("".join(lines[offset:offset + page_lines]), offset, limit, per_line, char_offset)
        assert (not limit or len(page.text) <= limit) and "[..." not in page.content
        assert page.text.count("read on with") <= 1
        got.append(page.content)
        if page.next_offset is not None:
            assert (page.next_offset, page.next_char_offset) > (offset, char_offset)  # always moves on
            offset, char_offset = page.next_offset, page.next_char_offset
        else:
            offset, char_offset = offset + page_lines, 0
    return "".join(got), calls


def test_following_the_next_call_reads_a_mixed_file_whole() -> None:
    """Review 32, F1: a page that cut a line and went on past it had two notes, and following either
    lost or repeated characters; the structured content held the marker."""
    repro = "short0\n" + "A" * 5000 + "\n" + "B" * 100 + "\n" + "C" * 5000 + "\nshort4\n"
    page = cap_page(repro, 0, 4000, line_chars(4000, None))
    assert page.content == "short0\n" + "A" * 2000 and (page.next_offset, page.next_char_offset) == (1, 2000)
    assert _follow(repro, 4000, line_chars(4000, None), 2000)[0] == repro
    mixed = "".join(("x" * (i * 997 % 7000)) + ("\r" if i % 5 == 0 else "") + "\n" + "short line\n" * (i % 4)
                    for i in range(300)) + "é" * 4321 + "\x0cno newline at the end"
    for limit, per_line, page_lines in ((4000, 2000, 2000), (32768, 2000, 2000), (700, 400, 3), (0, 0, 2000)):
        text, calls = _follow(mixed, limit, per_line, page_lines)
        assert text == mixed, (limit, per_line, page_lines)
        assert calls > len(mixed) // limit if limit else calls == 1


def test_the_first_line_is_always_shown_and_a_cut_line_fits_the_budget() -> None:
    per_line = line_chars(500, 100_000)
    assert per_line == 200 and line_chars(0, None) == 0 and line_chars(32768, None) == 2000
    page = cap_page("x" * 10_000, 0, 500, per_line)
    assert len(page.text) <= 500 and (page.next_offset, page.next_char_offset) == (0, 200)
    assert page.cut_lines[0]["next_char_offset"] == 200


def test_fit_counts_the_text_and_the_structured_copy() -> None:
    items = [{"path": f"p{i}", "size": i, "modified": 1.5, "is_dir": False} for i in range(1000)]
    lines, n = fit(items, lambda d: d["path"], lambda d: d, 1000)
    assert lines == [f"p{i}" for i in range(n)] and 0 < n < 1000
    assert len(json.dumps(items[:n])) <= 1000 + n  # bounded by the JSON, not by the short lines
    assert fit(items[:3], lambda d: d["path"], lambda d: d, 0)[1] == 3
    assert fit([{"path": "x" * 5000}], lambda d: d["path"], lambda d: d, 100)[1] == 1  # never none


def test_fit_json_cuts_long_strings_then_long_lists() -> None:
    value = {"command": "c" * 100_000, "pid": 7, "rows": [{"n": i, "s": "s" * 50} for i in range(10_000)]}
    out, before = fit_json(value, 5000)
    assert before == len(json.dumps(value)) and len(json.dumps(out, ensure_ascii=False)) <= 5000
    assert out["pid"] == 7 and out["command"].startswith("c" * 64) and "more characters cut" in out["command"]
    small = {"a": 1}
    assert fit_json(small, 5000) == (small, 0) and fit_json(value, 0) == (value, 0)


def test_the_net_caps_any_tool_result_and_says_so() -> None:
    limit = ceiling(1000)
    big = types.CallToolResult(content=[types.TextContent(type="text", text="t" * 100_000)],
                               structured_content={"processes": [{"command": "x" * 50_000}] * 10,
                                                   "output_capped": {"stdout": {"cut": 1}}})
    out = cap_result(big, 1000)
    assert len(out.content[0].text) <= limit and "characters of this reply cut here" in out.content[0].text
    assert len(json.dumps(out.structured_content)) <= limit + 200
    assert out.structured_content["output_capped"]["stdout"] == {"cut": 1}
    assert out.structured_content["output_capped"]["reply"]["limit"] == limit
    small = types.CallToolResult(content=[types.TextContent(type="text", text="ok")], structured_content={"a": 1})
    assert cap_result(small, 1000) is small and cap_result(big, 0) is big


def test_mains_result_is_capped_like_a_stream() -> None:
    r = ExecutionResult(stdout="", stderr="", exit_code=0, execution_time=0.1, result=["v" * 100] * 1000)
    out = execution_result(r, "s1", max_output=2000)
    capped = out.structured_content["output_capped"]["result"]
    assert capped["characters"] == len(json.dumps(r.result)) and capped["limit"] == 2000
    assert len(out.structured_content["result"]) < 2600 and "characters of result cut here" in out.content[0].text
    small = ExecutionResult(stdout="", stderr="", exit_code=0, execution_time=0.1, result=[1, 2])
    whole = execution_result(small, "s1")
    assert whole.structured_content["result"] == [1, 2] and "output_capped" not in whole.structured_content


def test_the_exception_is_named_for_the_model_and_its_text_is_capped() -> None:
    tb = "Traceback (most recent call last):\n" + "  File \"<code>\", line 1, in f\n" * 3000 + "ValueError: bad\n"
    r = ExecutionResult(stdout="", stderr=tb, exit_code=1, execution_time=0.1,
                        error={"name": "ValueError", "value": "bad\nsecond line", "traceback": tb})
    out = execution_result(r, "s1", max_output=2000)
    text = out.content[0].text
    assert "exception: ValueError: bad\n" in text and "second line" not in text.split("exception:")[1]
    error = out.structured_content["error"]
    assert error["name"] == "ValueError" and error["value"] == "bad\nsecond line"
    assert len(error["traceback"]) < 2600 and error["traceback"].endswith("ValueError: bad\n")
    assert out.structured_content["output_capped"]["error.traceback"]["characters"] == len(tb)
    clean = execution_result(ExecutionResult(stdout="1\n", stderr="", exit_code=0, execution_time=0.1), "s1")
    assert "exception:" not in clean.content[0].text and clean.structured_content["error"] is None
