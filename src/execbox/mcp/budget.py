"""How much of one tool result the model gets, for every tool (review 31, F3).

``EXECBOX_MCP_MAX_OUTPUT`` (``--max-output``; characters, ``0``: no cap) is the budget ``B``:

- a run's stdout, stderr and ``main()`` result get up to ``B`` characters each (head and tail,
  output_cap.py);
- a page of ``read_file`` and the text of ``list_files``, ``glob`` and ``grep`` hold at most ``B``
  characters; a line longer than ``read_file``'s ``max_line_chars`` is cut and ends the page, and
  every cut says the exact arguments that read on (``offset`` and ``char_offset``; a listing: what
  was left out and how to narrow it). The structured content carries the same capped copy (a
  page's ``content`` without the marker: the next call is in ``next_offset`` / ``next_char_offset``);
- whatever a tool returns, its text and (apart) its structured content never pass ``ceiling(B)``:
  ``cap_result`` is applied to every tool result in server.py, a net under the per-tool caps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp_types as types

from .output_cap import cap_stream

LINE_CHARS = 2000
"""Characters of one line read_file shows by default (``max_line_chars``) while a cap is set."""
MARKER_ROOM = 300
"""Characters kept free beside a cut line for its marker, so one cut line always fits the budget."""
NARROW = ("Ask for less at a time (a narrower path, pattern or page), or send the output to a file and page "
          "it with read_file")
MIN_STRING = 64
"""The net never cuts a structured string shorter than this."""

T = TypeVar("T")


def ceiling(limit: int) -> int:
    """Characters one tool result's text, and apart its structured content, may hold (0: no cap):
    room for a run's three capped parts (stdout, stderr, result) and what is said around them."""
    return 0 if limit <= 0 else 4 * limit + 8192


def line_chars(limit: int, asked: int | None) -> int:
    """The per-line cap of read_file: ``asked`` (default LINE_CHARS), never so large that a cut
    line and its marker pass the budget; 0 (no per-line cap) when there is no budget and none asked."""
    if limit <= 0:
        return asked or 0
    return max(1, min(asked or LINE_CHARS, limit - MARKER_ROOM))


# -- read_file -------------------------------------------------------------------------------------
@dataclass
class Page:
    content: str
    """The characters shown, exactly as in the file (no marker): following ``next_offset`` /
    ``next_char_offset`` and joining the ``content`` of each reply gives the file back whole."""
    next_offset: int | None
    """The first line not shown, or the line cut short, when the page ended early; None when it did not."""
    next_char_offset: int = 0
    """Where line ``next_offset`` reads on when the page ended in a cut line (0: at its start)."""
    cut_lines: list[dict[str, int]] = field(default_factory=list)
    """``{line, characters, next_char_offset}`` of the line shown in part (``line``: 0-based): a page
    ends at its first cut line, so there is at most one."""
    characters: int = 0
    """Characters of the page as read (from ``char_offset`` on)."""

    @property
    def note(self) -> str:
        """The marker after a cut line, naming the exact next call; empty when no line was cut."""
        if not self.cut_lines:
            return ""
        cut = self.cut_lines[0]
        return (f" [... {cut['characters'] - cut['next_char_offset']} more characters in this line: "
                f"read on with offset={cut['line']} char_offset={cut['next_char_offset']}]")

    @property
    def text(self) -> str:
        """``content`` as the model sees it: with the cut line's marker."""
        return self.content + self.note


def _lines(content: str) -> list[str]:
    """``content`` split after each ``\n`` (only: lines are counted as the agent counts them)."""
    lines = content.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    return out + [lines[-1]] if lines[-1] else out


def cap_page(content: str, first_line: int, limit: int, per_line: int, char_offset: int = 0) -> Page:
    """Lines of a page (``content`` starts at line ``first_line``, 0-based) within ``limit``
    characters (0: no limit), the first line starting at its character ``char_offset``. A line longer
    than ``per_line`` characters (0: no cap) is shown in part and ends the page, so that a page has
    one way to read on, never two: ``next_offset`` (and ``next_char_offset`` inside a cut line)."""
    lines = _lines(content)
    if char_offset and lines:
        lines[0] = lines[0][char_offset:]
    out: list[str] = []
    cut: list[dict[str, int]] = []
    used = 0
    next_offset = None
    next_char = 0
    for i, line in enumerate(lines):
        n = first_line + i
        start = char_offset if i == 0 else 0
        body = line[:-1] if line.endswith("\n") else line
        piece = line
        if per_line and len(body) > per_line:
            piece = body[:per_line]
            mark = Page("", None, cut_lines=[{"line": n, "characters": start + len(body),
                                              "next_char_offset": start + per_line}])
            if limit and out and used + len(piece) + len(mark.note) > limit:
                next_offset = n
                break
            out.append(piece)
            cut, next_offset, next_char = mark.cut_lines, n, start + per_line
            break
        if limit and out and used + len(piece) > limit:
            next_offset = n
            break
        out.append(piece)
        used += len(piece)
    return Page("".join(out), next_offset, next_char, cut, sum(len(line) for line in lines))


# -- listings --------------------------------------------------------------------------------------
def fit(items: Sequence[T], render: Callable[[T], str], data: Callable[[T], Any], room: int) -> tuple[list[str], int]:
    """The rendered lines of the leading ``items`` that fit ``room`` characters (0: all of them) in
    the text (a line and a newline each) and, apart, in the structured content (``data(item)`` as
    JSON), and how many that is. Never fewer than one when there is one."""
    shown: list[str] = []
    text = json_used = 0
    for item in items:
        line = render(item)
        size = _size(data(item)) + 1
        if room and shown and (text + len(line) + 1 > room or json_used + size > room):
            break
        shown.append(line)
        text += len(line) + 1
        json_used += size
    return shown, len(shown)


def left_out(omitted: int, total: int, what: str, limit: int, how: str) -> str:
    return (f"[{omitted} of {total} {what} not shown: a reply holds at most {limit} characters; {how}]")


# -- the net under every tool result ---------------------------------------------------------------
def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def _cut_strings(value: Any, keep: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= keep else f"{value[:keep]}[... {len(value) - keep} more characters cut]"
    if isinstance(value, dict):
        return {k: _cut_strings(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_strings(v, keep) for v in value]
    return value


def _cut_lists(value: Any, keep: int) -> Any:
    if isinstance(value, dict):
        return {k: _cut_lists(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_lists(v, keep) for v in value[:keep]]
    return value


def fit_json(value: dict[str, Any], limit: int) -> tuple[dict[str, Any], int]:
    """``value`` cut until its JSON holds at most ``limit`` characters: long strings first (each to a
    head and a marker), then long lists (their leading items). Returns it and its size before (0: it
    fitted as it was)."""
    size = _size(value)
    if limit <= 0 or size <= limit:
        return value, 0
    keep = max(limit // 4, MIN_STRING)
    out: Any = value
    while True:
        out = _cut_strings(value, keep)
        if _size(out) <= limit or keep <= MIN_STRING:
            break
        keep = max(keep // 2, MIN_STRING)
    items = 1024
    while _size(out) > limit and items >= 1:
        out = _cut_lists(_cut_strings(value, keep), items)
        items //= 2
    if _size(out) > limit:
        out = {}
    return out, size


def cap_result(result: types.CallToolResult, max_output: int) -> types.CallToolResult:
    """``result`` with its text and its structured content each within ``ceiling(max_output)``
    characters; what was cut is said (text: a note; structured: ``output_capped.reply``)."""
    limit = ceiling(max_output)
    if limit <= 0:
        return result
    content: list[Any] = []
    used = 0
    changed = False
    dropped = 0
    for block in result.content:
        if not isinstance(block, types.TextContent):
            content.append(block)
            continue
        room = limit - used
        if room <= 0:
            dropped += 1
            changed = True
            continue
        if len(block.text) > room:
            block = block.model_copy(update={"text": cap_stream(block.text, max(room - MARKER_ROOM, 1), "this reply",
                                                                NARROW).text})
            changed = True
        content.append(block)
        used += len(block.text)
    if dropped:
        content.append(types.TextContent(type="text", text=f"[{dropped} more text blocks left out: a reply holds "
                                                            f"at most {limit} characters]"))
    structured = result.structured_content
    if structured is not None:
        fitted, before = fit_json(structured, limit)
        if before:
            capped = fitted.get("output_capped")
            note = {"characters": before, "limit": limit}
            fitted = {**fitted, "output_capped": {**capped, "reply": note} if isinstance(capped, dict)
                      else {"reply": note}}
            structured = fitted
            changed = True
    if not changed:
        return result
    return result.model_copy(update={"content": content, "structured_content": structured})
