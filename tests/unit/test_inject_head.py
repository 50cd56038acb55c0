"""The injector's request head: the secret goes only with a request for the credentialed host.

A shared front end routes by Host and by an absolute-form target, so the box must not choose
either when a secret rides along (found by trying: `Host: attacker.example` got the API key).
"""

from __future__ import annotations

import pytest

from execbox.egress.inject import HeadRefused, rewrite_head

NAME = "api.example.com"
SECRET = (("Authorization", "Bearer sk-SECRET"),)


def headers_of(out: bytes) -> list[tuple[bytes, bytes]]:
    assert out.endswith(b"\r\n\r\n")
    return [tuple(x.strip() for x in ln.split(b":", 1)) for ln in out[:-4].split(b"\r\n")[1:]]


def test_the_box_cannot_pick_the_host_that_gets_the_secret():
    head = (b"GET /v1/x?q=1 HTTP/1.1\r\nHost: attacker.example\r\nhost: other.example\r\n"
            b"Authorization: Bearer x\r\nAccept: */*")
    out = rewrite_head(head, NAME, SECRET)
    assert out.split(b"\r\n")[0] == b"GET /v1/x?q=1 HTTP/1.1"
    hs = headers_of(out)
    assert [v for k, v in hs if k.lower() == b"host"] == [NAME.encode()]
    assert [v for k, v in hs if k.lower() == b"authorization"] == [b"Bearer sk-SECRET"]
    assert (b"Accept", b"*/*") in hs and (b"Connection", b"close") in hs


def test_an_absolute_target_for_this_host_becomes_origin_form():
    out = rewrite_head(b"POST https://API.example.com:443/a/b?c HTTP/1.1\r\nHost: api.example.com", NAME, SECRET)
    assert out.split(b"\r\n")[0] == b"POST /a/b?c HTTP/1.1"


@pytest.mark.parametrize("head", [
    b"GET https://attacker.example/collect HTTP/1.1\r\nHost: api.example.com",
    b"GET http://api.example.com/x HTTP/1.1\r\nHost: api.example.com",
    b"GET https://api.example.com:8443/x HTTP/1.1\r\nHost: api.example.com",
    b"GET https://user@api.example.com/x HTTP/1.1\r\nHost: api.example.com",
    b"GET api.example.com:443 HTTP/1.1\r\nHost: api.example.com",
    b"GET /x HTTP/1.1\r\nHost: api.example.com\r\nX-Foo: a\nAuthorization: Bearer box-own",
    b"GET /x HTTP/1.1\r\nHost: api.example.com\r\nX-Foo: a\r\n Authorization: folded",
    b"GET /x HTTP/1.1\r\nHost: api.example.com\r\nX-Foo: a\rb",
    b"GET /x\r\nHost: api.example.com",
    b"GET /x HTTP/2\r\nHost: api.example.com",
])
def test_heads_that_could_reach_another_site_or_parse_two_ways_are_refused(head):
    with pytest.raises(HeadRefused):
        rewrite_head(head, NAME, SECRET)


def test_headers_a_front_end_may_route_by_are_not_forwarded():
    head = (b"GET /x HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-Host: attacker.example\r\n"
            b"Forwarded: host=attacker.example\r\nX-Original-URL: https://attacker.example/\r\nX-Keep: 1")
    names = [k.lower() for k, _ in headers_of(rewrite_head(head, NAME, SECRET))]
    assert b"x-forwarded-host" not in names and b"forwarded" not in names and b"x-original-url" not in names
    assert b"x-keep" in names


@pytest.mark.parametrize("head", [b"TRACE / HTTP/1.1\r\nHost: api.example.com",
                                  b"TRACK / HTTP/1.1\r\nHost: api.example.com",
                                  b"GET /\thttp://attacker.example/ HTTP/1.1\r\nHost: api.example.com",
                                  b"GET /\x7f HTTP/1.1\r\nHost: api.example.com",
                                  "GET /é HTTP/1.1\r\nHost: api.example.com".encode()])
def test_trace_and_odd_targets_get_no_secret(head):
    with pytest.raises(HeadRefused):
        rewrite_head(head, NAME, SECRET)


@pytest.mark.parametrize("head", [
    b"trace / HTTP/1.1\r\nHost: api.example.com",  # a method is compared in any case
    b"Trace / HTTP/1.1\r\nHost: api.example.com",
    b"GET /x HTTP/1.1x\r\nHost: api.example.com",  # only HTTP/1.0 and HTTP/1.1
    b"GET /x HTTP/1.2\r\nHost: api.example.com",
    b"G(T /x HTTP/1.1\r\nHost: api.example.com",
    b"GET /x HTTP/1.1\r\nHost evil.example",  # no colon: a lenient parser may read it as Host
    b"GET /x HTTP/1.1\r\nHost : evil.example",  # space before the colon
    b"GET /x HTTP/1.1\r\nX-Api-Key\t: a3",
])
def test_methods_in_any_case_odd_versions_and_lines_without_a_name_are_refused(head):
    with pytest.raises(HeadRefused):
        rewrite_head(head, NAME, SECRET)


def test_the_response_is_asked_for_uncompressed():
    """A compressed response would hide a reflected secret from the scrubber."""
    out = rewrite_head(b"GET /x HTTP/1.1\r\nAccept-Encoding: gzip, br\r\nTE: gzip\r\nAccept: */*", NAME, SECRET)
    hs = headers_of(out)
    assert [v for k, v in hs if k.lower() == b"accept-encoding"] == [b"identity"]
    assert not [k for k, _ in hs if k.lower() == b"te"]
