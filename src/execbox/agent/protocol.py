"""Framed JSON protocol between a host and the in-box agent.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Requests carry
``id`` and ``op``; the agent answers with zero or more events (``{"id", "event", ...}``) and then
exactly one reply (``{"id", "ok": true, "value"}`` or ``{"id", "ok": false, "error"}``).
Stdlib only: this module is imported inside boxes and by the host.
"""

from __future__ import annotations

import os
import struct

from .lean import dumps, loads

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 512 * 1024 * 1024
"""The agent's own bound on a frame (requests it reads, replies it writes). The host reads boxes'
frames under a far smaller cap of its own (boxes/agent_client.py ``MAX_REPLY_FRAME``): a box is
not trusted, and its frames are buffered in the shared gateway's memory."""
PROTOCOL_VERSION = 1
INLINE_OPS = frozenset({"ping", "proc.start", "proc.poll", "proc.input", "proc.close_stdin", "proc.signal",
                        "proc.list", "proc.resize"})
"""Ops the agent answers even while an ``exec`` runs; the host sends them without waiting for it."""
FILE_OPS = frozenset({"files.read", "files.read_bytes", "files.write", "files.write_many", "files.list",
                      "files.glob", "files.grep", "files.delete", "files.mkdir", "files.move"})
"""Workspace file ops the agent also serves during a run, as E2B's envd does beside its code
interpreter. The agent names them in its ready message (``beside_run``); a host sends them without
waiting for a run only to an agent that does (an older agent would hold them until the run ends)."""
BESIDE_RUN = INLINE_OPS | FILE_OPS


class ProtocolError(Exception):
    pass


class FrameTooLarge(ProtocolError):
    """A frame header announced more bytes than the reader accepts; nothing of it was buffered."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds {limit}")
        self.size = size
        self.limit = limit


def encode_frame(message: dict[str, Any]) -> bytes:
    """One frame. A reply holding text with no UTF-8 form (a lone surrogate: a file name in other
    bytes) becomes an SB002 error reply naming where it was: the reply is lost, the session is not.
    Any other message raises the UnicodeEncodeError (the host maps a request's to SB002 itself)."""
    try:
        body = dumps(message, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        if "ok" not in message:
            raise
        where = not_utf8(message) or "?"
        body = dumps({"id": message.get("id"), "ok": False, "error": {
            "code": "SB002", "status": 400, "details": {"field": where},
            "message": f"the reply could not be sent: its field {where!r} holds text that is not valid "
                       "UTF-8 (a file name in another encoding?)"}}).encode("ascii")
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def not_utf8(value: Any, path: str = "", depth: int = 0) -> str | None:
    """The dotted name of the first string (or key) in ``value`` with no UTF-8 form."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "value"
        return None
    if depth > 32:
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        if isinstance(key, str) and not_utf8(key) is not None:
            return path or "key"
        found = not_utf8(item, f"{path}.{key}" if path else str(key), depth + 1)
        if found is not None:
            return found
    return None


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = memoryview(encode_frame(message))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("stream closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any]:
    (size,) = HEADER.unpack(read_exact(fd, HEADER.size))
    if size > MAX_FRAME:
        raise FrameTooLarge(size, MAX_FRAME)
    return loads(read_exact(fd, size))


class FrameBuffer:
    """Incremental decoder for non-blocking reads: feed bytes, pop complete messages.

    ``max_frame`` bounds one frame: a header announcing more raises ``FrameTooLarge`` as soon as
    its 4 bytes are in, before any of the body is waited for (the buffer then holds no more than
    the one chunk fed). A reader may change it between feeds (the host raises it while a request
    that may have a larger reply is outstanding).
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self.max_frame:
                raise FrameTooLarge(size, self.max_frame)
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            # Decoded straight from the buffer: no bytes copy of a frame that may be large.
            view = memoryview(self._buf)
            try:
                text = str(view[HEADER.size : end], "utf-8", "surrogatepass")  # as json.loads decodes bytes
            finally:
                view.release()
                del self._buf[:end]  # a frame that fails to decode is gone all the same
            out.append(loads(text))
        return out
