"""The bytes of an intercepted connection after its head (egress/inject_http.py, inject.py).

- ``RequestBody``: the upstream gets the one request's body and nothing after it: an upstream
  that ignores ``Connection: close`` read a pipelined second request, with the box's own Host.
- ``Scrubber``: an API that echoes request headers showed the injected secret to the box.
- ``upstream_context``: built per connection (~45 ms on the gateway's one event loop), it let
  one box stall every box's egress; it is built once per EXECBOX_EGRESS_UPSTREAM_CA value.
"""

from __future__ import annotations

import ssl

import pytest

from execbox.egress.inject_http import HeadRefused, RequestBody, Scrubber, request_body, secret_values

HEAD = b"POST /x HTTP/1.1\r\nHost: api.example.com"


def bytewise(body: RequestBody, data: bytes) -> bytes:
    return b"".join(body.feed(data[i:i + 1]) for i in range(len(data)))


def test_a_content_length_body_passes_and_nothing_after_it():
    body = request_body(HEAD + b"\r\nContent-Length: 5")
    assert body.feed(b"hel") + body.feed(b"lo") == b"hello" and body.done
    with pytest.raises(ValueError, match="one request per intercepted connection"):
        body.feed(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(ValueError):  # a body and a second request in one read: none of it
        request_body(HEAD + b"\r\nContent-Length: 5").feed(b"helloGET /")
    with pytest.raises(ValueError):  # no length: no body
        request_body(b"GET /x HTTP/1.1\r\nHost: a").feed(b"G")


def test_a_chunked_body_passes_in_any_pieces_and_ends_at_its_last_chunk():
    raw = b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"
    body = request_body(HEAD + b"\r\nTransfer-Encoding: Chunked")
    assert bytewise(body, raw) == raw and body.done
    with pytest.raises(ValueError, match="one request"):
        body.feed(b"G")
    whole = request_body(HEAD + b"\r\nTransfer-Encoding: chunked")
    with pytest.raises(ValueError, match="one request"):
        whole.feed(raw + b"GET /smuggled HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("raw", [
    b"5;ext=1\r\nhello\r\n0\r\n\r\n",  # chunk extensions
    b"5\nhello\r\n0\r\n\r\n",  # a bare LF
    b"5\r\nhelloX\r\n0\r\n\r\n",  # data longer than its size
    b"0\r\nX-Trailer: 1\r\n\r\n",  # trailers
    b"-5\r\n", b" 5\r\n", b"0x5\r\n", b"1" * 70,
])
def test_chunked_framing_two_parsers_could_read_differently_ends_the_connection(raw):
    body = request_body(HEAD + b"\r\nTransfer-Encoding: chunked")
    with pytest.raises(ValueError):
        bytewise(body, raw)


@pytest.mark.parametrize("extra", [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked",
    b"Transfer-Encoding: gzip, chunked",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    b"Content-Length: 5\r\nContent-Length: 6",
    b"Content-Length: +5",
    b"Content-Length: 5, 5",
])
def test_heads_with_ambiguous_framing_are_refused(extra):
    with pytest.raises(HeadRefused):
        request_body(HEAD + b"\r\n" + extra)


SECRETS = secret_values((("X-Api-Key", "sk-live-0123456789"), ("Authorization", "Bearer tok-abcdef123456")))


def test_every_secret_is_masked_at_the_same_length_across_any_split():
    body = (b'HTTP/1.1 200 OK\r\nContent-Length: 99\r\nX-Echo: sk-live-0123456789\r\n\r\n'
            b'{"auth": "Bearer tok-abcdef123456", "quoted": "invalid key tok-abcdef123456", "k": "sk-live-0123456789"}')
    for step in (1, 2, 3, 7, 17, len(body)):
        s = Scrubber(SECRETS)
        out = b"".join(s.feed(body[i:i + step]) for i in range(0, len(body), step)) + s.end()
        assert len(out) == len(body), step
        assert b"sk-live" not in out and b"tok-abc" not in out, (step, out)
        assert b"X-Echo: " + b"*" * 18 in out and b'"auth": "' + b"*" * 23 + b'"' in out
        assert b"invalid key " + b"*" * 16 in out


def test_only_a_possible_start_of_a_secret_is_held_back():
    """A streamed response (server-sent events) is passed on at once."""
    s = Scrubber(SECRETS)
    assert s.feed(b"data: {\"x\": 1}\n\n") == b"data: {\"x\": 1}\n\n"
    assert s.feed(b"data: sk-li") == b"data: " and s.feed(b"ve-012") == b""
    assert s.feed(b"3456789 ok") == b"*" * 18 + b" ok"
    assert s.feed(b"tail sk") == b"tail " and s.end() == b"sk"


def test_short_values_are_not_scrubbed():
    assert Scrubber(secret_values((("X-K", "abc"),))).feed(b"abc abc") == b"abc abc"


def test_the_upstream_context_is_built_once_per_ca_setting(monkeypatch, tmp_path):
    from execbox.egress import inject
    from tests.fakenet import make_ca_and_cert

    real, built = ssl.create_default_context, []

    def counting(*a, **kw):
        built.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(inject, "_upstream", None, raising=False)  # absent before the cache
    monkeypatch.delenv("EXECBOX_EGRESS_UPSTREAM_CA", raising=False)
    first = inject.upstream_context()
    assert all(inject.upstream_context() is first for _ in range(5)) and len(built) == 1
    ca = make_ca_and_cert(["x.test"], "192.0.2.1", str(tmp_path))[0]
    monkeypatch.setenv("EXECBOX_EGRESS_UPSTREAM_CA", ca)
    second = inject.upstream_context()
    assert second is not first and inject.upstream_context() is second and len(built) == 2
