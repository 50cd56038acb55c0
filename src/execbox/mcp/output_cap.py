"""The model-facing cap on a run's stdout and stderr in an MCP tool result.

The sandbox keeps up to its provider's ``max_output_bytes`` (1 MiB by default) of each stream;
a model's context should not take that much from one tool call. What the model gets of a longer
stream is its head and its tail (an error and its traceback are usually at the end) with a note in
between saying how much was cut and how to read all of it (write it to a file, page it with
read_file). ``EXECBOX_MCP_MAX_OUTPUT`` (characters per stream; ``0``: no cap) or
``execbox mcp --max-output`` sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import env_int

DEFAULT_MAX_OUTPUT = 32 * 1024
"""Characters of one stream the model sees by default (E2B and Jupyter MCP servers give ~20-30 k)."""
ENV = "EXECBOX_MCP_MAX_OUTPUT"
HEAD_SHARE = 0.5
"""Share of the cap given to the stream's head; the rest goes to its tail."""


def max_output_from_env() -> int:
    """EXECBOX_MCP_MAX_OUTPUT, or the default; a bad value is SB002 naming the variable."""
    return env_int(ENV, DEFAULT_MAX_OUTPUT)


@dataclass(frozen=True)
class Capped:
    text: str
    """What the model reads: the whole stream, or its head, a note, and its tail."""
    total: int
    """Characters in the stream."""
    cut: int
    """Characters left out (0: nothing was)."""


RUN_AGAIN = ("To read all of it, run the command again with its output sent to a file (e.g. "
             "`... > out.txt 2>&1`, or write to a file from the code) and page that file with read_file "
             "(offset, limit; a long line with char_offset), or search it with grep")
"""How to read a run's whole stream: the end of the note in the middle of a capped one."""


def cap_stream(text: str, limit: int, stream: str, how: str = RUN_AGAIN) -> Capped:
    """``text`` as the model sees it, at most ``limit`` characters of it (plus the note); cuts fall
    on line ends where one is near, so no line is shown half. ``how`` ends the note: how to read
    all of it."""
    total = len(text)
    if limit <= 0 or total <= limit:
        return Capped(text, total, 0)
    head_len = int(limit * HEAD_SHARE)
    tail_len = limit - head_len
    head = text[:head_len]
    tail = text[total - tail_len:]
    nl = head.rfind("\n")
    if nl >= head_len // 2:
        head = head[:nl + 1]
    nl = tail.find("\n")
    if 0 <= nl < tail_len // 2:
        tail = tail[nl + 1:]
    cut = total - len(head) - len(tail)
    note = (f"\n[... {cut} of {total} characters of {stream} cut here: the model sees at most {limit} per "
            f"stream. {how} ...]\n")
    return Capped(head + note + tail, total, cut)


def read_limit(limit: int, chunk: int) -> int:
    """Bytes of a background process's stream one read gives the model: at most the cap (a byte is at
    most one character), at most ``chunk``. Nothing is cut: the rest waits for the next read, from the
    offset the reply gives (``0``: no cap, ``chunk``). Never under 4, so a 4-byte character gets through."""
    return chunk if limit <= 0 else max(4, min(limit, chunk))
