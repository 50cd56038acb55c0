"""A body that is not a JSON object says so (review 29, finding 11): a JSON syntax error names the
field ``body`` with the position in the message (``details.field`` was the byte offset, "38"),
and a text/plain body says a JSON object is expected (it said "Input should be a valid dictionary")."""

from __future__ import annotations

import pytest

from .conftest import Service, error_of


@pytest.mark.parametrize("raw, at", [('{"code": "print(1)", "session_id": "e1",}', 40), ("not json", 0)])
def test_a_json_syntax_error_names_the_body_and_the_position(service: Service, raw: str, at: int) -> None:
    r = service.a.post("/v1/sandbox/execute", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "SB002" and err["details"]["field"] == "body"
    assert err["message"].startswith(f"invalid request: body: not valid JSON at byte {at} (")
    assert "a JSON object body is expected" in err["message"]


def test_a_text_body_says_a_json_object_is_expected(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", content='{"code": "1"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400
    err = error_of(r)
    assert err["details"]["field"] == "body"
    assert "JSON object body is expected" in err["message"] and "text/plain" in err["message"]
    listed = service.a.post("/v1/sandbox/execute", json=[1, 2])
    assert listed.status_code == 400 and "JSON object body is expected" in error_of(listed)["message"]
    empty = service.a.post("/v1/sandbox/execute", headers={"content-type": "application/json"})
    assert empty.status_code == 400 and "JSON object body is expected" in error_of(empty)["message"]
