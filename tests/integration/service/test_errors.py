"""Every error path answers the one JSON shape with its SB code and status; nothing is a 500."""

from __future__ import annotations

import base64

import pytest

from .conftest import Service, error_of


def test_missing_and_invalid_tokens_are_401(service: Service) -> None:
    anon = service.client()
    r = anon.post("/v1/sandbox/execute", json={"code": "print(1)"})
    assert r.status_code == 401 and error_of(r)["code"] == "SB002"
    bad = service.client("ebx_not-a-real-token-0000")
    r = bad.post("/v1/sandbox/execute", json={"code": "print(1)"})
    assert r.status_code == 401
    assert "ebx_not-a-real-token-0000" not in r.text  # the token never comes back


def test_revoked_token_is_401(service: Service) -> None:
    rec, token = service.store.tokens.create("tenant-c")
    c = service.client(token)
    assert c.post("/v1/sandbox/execute", json={"code": "1"}).status_code == 200
    service.store.tokens.revoke(rec.id)
    assert c.post("/v1/sandbox/execute", json={"code": "1"}).status_code == 401


@pytest.mark.parametrize("body, field", [
    ({"code": "print(1)", "language": "cobol"}, "language"),
    ({"code": 5}, "code"),
    ({}, "code"),
    ({"code": "1", "timeout": -1}, "timeout"),
    ({"code": "1", "timeout": 10**9}, "timeout"),
    ({"code": "1", "session_id": "../etc"}, "session_id"),
    ({"code": "1", "session_id": ""}, "session_id"),
    ({"code": "1", "tenant_id": "a/b"}, "tenant_id"),
    ({"code": "1", "arguments": [1, 2]}, "arguments"),
    ({"code": "1", "unexpected": True}, "unexpected"),
    ({"code": "1", "context_id": "c"}, "context_id"),
])
def test_bad_execute_bodies_are_400_naming_the_field(service: Service, body: dict, field: str) -> None:
    r = service.a.post("/v1/sandbox/execute", json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["code"] == "SB002" and err["details"]["field"] == field, err


def test_invalid_json_and_wrong_content_are_400(service: Service) -> None:
    c = service.a
    r = c.post("/v1/sandbox/execute", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "SB002"
    r = c.post("/v1/sandbox/execute", content=b"\xff\xfe", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = c.post("/v1/sandbox/execute", json=[1, 2, 3])
    assert r.status_code == 400


def test_bad_base64_is_400_naming_the_field(service: Service) -> None:
    c = service.a
    r = c.post("/v1/sandbox/write", json={"session_id": "err", "path": "a", "content_b64": "@@@"})
    assert r.status_code == 400 and error_of(r)["details"]["field"] == "content_b64"
    r = c.post("/v1/sandbox/write", json={"session_id": "err", "path": "a"})
    assert r.status_code == 400 and error_of(r)["details"]["field"] == "content"
    r = c.post("/v1/sandbox/sessions/tenant-a/err/copy",
               json={"files": [{"path": "ok", "content": "1"}, {"path": "x", "content_b64": "!"}]})
    assert r.status_code == 400 and error_of(r)["details"]["field"] == "files.1.content_b64"


def test_oversized_code_file_and_body_are_413(service_factory) -> None:
    svc = service_factory(max_code_bytes=1000, max_file_bytes=2000, max_request_bytes=64 * 1024)
    c = svc.a
    r = c.post("/v1/sandbox/execute", json={"code": "#" * 1001})
    assert r.status_code == 413 and error_of(r)["details"] == {"field": "code", "size": 1001, "limit": 1000}
    r = c.post("/v1/sandbox/bash", json={"command": "#" * 1001})
    assert r.status_code == 413 and error_of(r)["details"]["field"] == "command"
    r = c.post("/v1/sandbox/write", json={"session_id": "big", "path": "f", "content": "x" * 2001})
    assert r.status_code == 413 and error_of(r)["details"]["field"] == "content"
    r = c.post("/v1/sandbox/write", json={"session_id": "big", "path": "f",
                                          "content_b64": base64.b64encode(b"x" * 4000).decode()})
    assert r.status_code == 413 and error_of(r)["details"]["field"] == "content_b64"
    r = c.post("/v1/sandbox/execute", json={"code": "#" * (70 * 1024)})
    assert r.status_code == 413 and error_of(r)["code"] == "SB002"

    def chunks():  # no Content-Length: the limit is counted while streaming
        for _ in range(80):
            yield b" " * 1024

    r = c.post("/v1/sandbox/execute", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "SB002"
    assert svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"}).status_code == 200


def test_paths_outside_the_workspace_are_400(service: Service) -> None:
    c = service.a
    for path in ("../x", "/etc/passwd", "a/../../b", "nul\x00byte"):
        r = c.post("/v1/sandbox/read", json={"session_id": "err", "path": path})
        assert r.status_code == 400 and error_of(r)["details"]["field"] == "path", (path, r.text)
    c.post("/v1/sandbox/bash", json={"session_id": "err", "command": "ln -sf /etc/passwd link"})
    r = c.post("/v1/sandbox/read", json={"session_id": "err", "path": "link"})
    assert r.status_code in (400, 404) and "root:" not in r.text


def test_missing_file_is_404(service: Service) -> None:
    r = service.a.post("/v1/sandbox/read", json={"session_id": "err", "path": "nope.txt"})
    assert r.status_code == 404 and error_of(r)["code"] == "SB002"


def test_timeout_is_408_with_the_partial_result(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={
        "code": "import time\nprint('before', flush=True)\ntime.sleep(30)", "timeout": 0.5})
    assert r.status_code == 408
    err = error_of(r)
    assert err["code"] == "SB005"
    assert err["details"]["result"]["stdout"] == "before\n" and err["details"]["result"]["timed_out"]


def test_program_failure_is_a_200_with_its_exit_code(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={"code": "raise SystemExit(3)"})
    assert r.status_code == 200 and r.json()["exit_code"] == 3


def test_unknown_route_and_method(service: Service) -> None:
    r = service.a.get("/v1/sandbox/nope")
    assert r.status_code == 404 and error_of(r)["code"] == "SB002"
    r = service.a.get("/v1/sandbox/execute")
    assert r.status_code == 405 and error_of(r)["code"] == "SB002"


def test_unexpected_errors_are_logged_500s_without_internals(service_factory, caplog) -> None:
    class Broken:
        def current(self):
            raise RuntimeError("secret internal detail")

        def candidates(self):
            return []

    svc = service_factory(provider=Broken())
    with caplog.at_level("ERROR", logger="execbox.service.errors"):
        r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "s"})
    assert r.status_code == 500
    err = error_of(r)
    assert err["code"] == "SB000" and "secret" not in r.text
    assert any("secret internal detail" in (rec.exc_text or "") or rec.exc_info for rec in caplog.records)


def test_no_provider_is_503(service_factory) -> None:
    from execbox.errors import ProviderNotInitializedError

    class Nothing:
        def current(self):
            raise ProviderNotInitializedError("no sandbox provider is configured")

        def candidates(self):
            return []

    svc = service_factory(provider=Nothing())
    r = svc.a.post("/v1/sandbox/execute", json={"code": "1"})
    assert r.status_code == 503 and error_of(r)["code"] == "SB001"
    assert r.headers.get("retry-after") == "1"
    ready = svc.client().get("/readyz")
    assert ready.status_code == 503 and error_of(ready)["details"]["reasons"]["provider"]


def test_connection_refused_client_error() -> None:
    from execbox import RemoteSandbox
    from execbox.errors import ConnectionFailedError

    with pytest.raises(ConnectionFailedError):
        RemoteSandbox("http://127.0.0.1:9", "t").run_code("1")


def test_out_of_memory_is_422_with_the_partial_result(service: Service) -> None:
    r = service.a.post("/v1/sandbox/execute", json={
        "code": "print('filling', flush=True)\nx = bytearray(1024 * 1024 * 1024)", "session_id": "oom"})
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert err["code"] == "SB006" and err["details"]["result"]["stdout"] == "filling\n"
    again = service.a.post("/v1/sandbox/execute", json={"code": "print('fine')", "session_id": "oom"})
    assert again.status_code == 200 and again.json()["stdout"] == "fine\n"  # the session lives on


def test_workspace_quota_full_is_507(service_factory, jail_provider) -> None:
    from execbox.providers.jail import JailProvider

    from .conftest import require

    small = JailProvider()
    small.initialize({"pool_size": 0, "preload": "none", "disk_quota_mb": 8})
    try:
        svc = service_factory(provider=small)
        blob = "x" * (1024 * 1024)
        statuses = [svc.a.post("/v1/sandbox/write", json={"session_id": "full", "path": f"f{i}", "content": blob}
                               ).status_code for i in range(12)]
        require(507 in statuses, "loop-mounted workspace quota")
        r = svc.a.post("/v1/sandbox/write", json={"session_id": "full", "path": "more", "content": blob})
        assert r.status_code == 507 and error_of(r)["code"] == "SB002"
    finally:
        small.shutdown()
