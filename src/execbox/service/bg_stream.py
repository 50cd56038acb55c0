"""The HTTP API's buffer of one background-process output stream (``background.py``): the bytes
a client has not acknowledged yet, read from byte offsets, never splitting a UTF-8 character
while the stream may still complete it."""

from __future__ import annotations


class Stream:
    """Output of one stream: bytes [base, base + len(buf)) are held."""

    __slots__ = ("base", "buf", "dropped")

    def __init__(self) -> None:
        self.base = 0
        self.buf = bytearray()
        self.dropped = 0  # bytes dropped before any client read them (an ended process's tail rule)

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def ack(self, offset: int) -> None:
        """Drop what lies before ``offset`` (the client has it)."""
        cut = min(max(0, offset - self.base), len(self.buf))
        if cut:
            del self.buf[:cut]
            self.base += cut

    def keep_tail(self, keep: int) -> None:
        """Drop all but the last ``keep`` bytes held (from a character's first byte on)."""
        cut = len(self.buf) - keep
        while 0 < cut < len(self.buf) and self.buf[cut] & 0xC0 == 0x80:
            cut += 1
        if cut > 0:
            del self.buf[:cut]
            self.base += cut
            self.dropped += cut

    def skip_to(self, offset: int) -> None:
        """Drop everything held and continue the stream at ``offset`` (the bytes before it are dropped)."""
        if offset > self.end:
            self.dropped += offset - self.base
            self.buf.clear()
            self.base = offset

    def take(self, offset: int, limit: int, whole: bool) -> tuple[bytes, int, int]:
        """(data, offset of its first byte, bytes skipped) from ``offset``. ``whole``: the stream
        has ended; otherwise a trailing incomplete UTF-8 sequence is left for the next read."""
        start = max(offset, self.base)
        skipped = start - offset
        data = bytes(self.buf[start - self.base:start - self.base + limit])
        if not whole and start - self.base + len(data) == len(self.buf):
            data = data[:len(data) - partial_utf8(data)]
        return data, start, skipped


def partial_utf8(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 sequence that is not complete yet."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0
