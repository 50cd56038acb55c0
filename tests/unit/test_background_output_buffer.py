"""The HTTP API's background-process output buffer (service/background.py): offsets acknowledge,
a read never splits a UTF-8 character while the stream may still complete it, and bytes dropped by
an earlier acknowledgement are reported as skipped rather than silently shifted."""

from __future__ import annotations

from execbox.service.background import _partial_utf8, _Stream


def test_partial_utf8_counts_only_an_incomplete_trailing_sequence() -> None:
    e_acute, euro, emoji = "é".encode(), "€".encode(), "😀".encode()
    assert _partial_utf8(b"abc") == 0
    assert _partial_utf8(b"a" + e_acute) == 0 and _partial_utf8(b"a" + e_acute[:1]) == 1
    assert _partial_utf8(euro[:2]) == 2 and _partial_utf8(euro) == 0
    assert _partial_utf8(emoji[:3]) == 3 and _partial_utf8(emoji) == 0
    assert _partial_utf8(b"\xff") == 0  # invalid, not incomplete: returned (and replaced) at once


def test_stream_reads_acknowledges_and_reports_skipped_bytes() -> None:
    s = _Stream()
    s.buf += b"hello " + "é".encode()[:1]
    data, start, skipped = s.take(0, 1024, whole=False)
    assert (data, start, skipped) == (b"hello ", 0, 0)  # the half character waits
    assert s.take(0, 1024, whole=True)[0] == b"hello \xc3"  # the stream ended: everything
    s.ack(3)
    assert (s.base, bytes(s.buf)) == (3, b"lo \xc3")
    assert s.take(3, 2, whole=False) == (b"lo", 3, 0)
    assert s.take(1, 1024, whole=True) == (b"lo \xc3", 3, 2)  # bytes 1-2 were acknowledged before
    s.ack(100)  # past the end: everything held is dropped, nothing more
    assert (s.base, s.end, bytes(s.buf)) == (7, 7, b"")
