"""How much of a workspace file one ``resources/read`` reply may carry.

A resource is a whole file in one reply (MCP's ``resources/read`` has no range), so a file larger
than ``EXECBOX_MCP_MAX_RESOURCE_BYTES`` (bytes of the file, before base64; default 4 MiB, at most
the 64 MiB of one workspace read; ``0``: that much) is refused with a JSON-RPC error naming its
size, the limit and how to read it instead, never sent cut short: a cut blob is a corrupt file and a
cut text (with a note in it) is not the file, and the protocol has no field a client would read as
"truncated". The service reads at most the limit to decide (a ranged read that also tells the
file's size), never the whole file.
"""

from __future__ import annotations

import shlex

from ..agent.fileops import MAX_READ_BYTES, SNIFF_BYTES
from ..errors import InvalidConfigError
from ..settings import env_int

ENV = "EXECBOX_MCP_MAX_RESOURCE_BYTES"
DEFAULT_MAX_RESOURCE_BYTES = 4 * 1024 * 1024
"""Bytes of one resource by default: as large as an image a tool result carries inline
(results.MAX_INLINE_IMAGE), under the ~5 MB models take per image, and ~5.6 MB of base64 JSON."""
REASON = "resource_too_large"
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript")
"""MIME types of a run's artifact too large to link that read_file is named for (results.py: its
content is not at hand to test; a resource read tests the content, ``looks_text``)."""


def max_resource_bytes_from_env() -> int:
    """EXECBOX_MCP_MAX_RESOURCE_BYTES (``0``: the 64 MiB of one read), or the default; a value that
    is not a whole number of bytes in 0..64 MiB is SB002 naming the variable."""
    n = env_int(ENV, DEFAULT_MAX_RESOURCE_BYTES)
    if n > MAX_READ_BYTES:
        raise InvalidConfigError(f"{ENV}: must be at most {MAX_READ_BYTES} (64 MiB, what one read of a workspace "
                                 "file holds; 0 means that much)", details={"field": ENV, "limit": MAX_READ_BYTES})
    return n or MAX_READ_BYTES


def looks_text(head: bytes) -> bool:
    """Whether read_file pages the file: no NUL byte in its first 8 KiB (agent/fileops.read_text)."""
    return b"\x00" not in head[:SNIFF_BYTES]


def how_to_read(session_id: str, path: str, limit: int, text: bool) -> tuple[str, str]:
    """(the tool to use, what to say) for a file over the limit: read_file pages a text file;
    a binary one is split in the box into pieces each within the limit, read as resources."""
    if text:
        return "read_file", (f"page it with the read_file tool (session_id={session_id!r}, path={path!r}, offset=0; "
                             "each reply names the next offset), or search it with grep")
    quoted = shlex.quote(path)
    return "run_command", (f"split it in the sandbox with the run_command tool (`split -b {limit} -d -a 3 {quoted} "
                           f"{shlex.quote(path + '.part-')}`) and read each {path}.part-NNN resource, or work "
                           "on it there with run_code or run_command")


def too_large(uri: str, session_id: str, path: str, size: int | None, limit: int,
              head: bytes) -> tuple[str, dict[str, object]]:
    """The refusal's message and data: the size (None: more than the limit), the limit, the way on."""
    tool, how = how_to_read(session_id, path, limit, looks_text(head))
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    message = (f"SB002: {path!r} is {what}, over the {limit}-byte limit of one resources/read ({ENV}); "
               f"nothing was sent. To read it, {how}.")
    data: dict[str, object] = {"code": "SB002", "reason": REASON, "uri": uri, "session_id": session_id,
                               "path": path, "size": size, "limit": limit, "setting": ENV, "tool": tool}
    return message, data
