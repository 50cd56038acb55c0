"""Bad and hostile input to the E2B endpoint (and /v1/sandbox) against a real `execbox serve`:
a clear 4xx with a bounded message, never a 500; code contexts are capped; a sandbox whose
session an operator destroyed is gone, as E2B reports a killed sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def box(e2b_server: Server) -> Iterator[object]:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("E2B_API_URL", e2b_server.url), ("E2B_SANDBOX_URL", e2b_server.url),
                            ("E2B_API_KEY", e2b_server.token_a)):
            mp.setenv(name, value)
        sandbox = ci.Sandbox.create(timeout=300)
        try:
            yield sandbox
        finally:
            sandbox.kill()


def _headers(sbx, port: int) -> dict[str, str]:  # noqa: ANN001
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port),
            "X-Access-Token": sbx._envd_access_token}


def _not_500(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert len(r.text) < 1000, r.text[:300]  # nothing unbounded echoed back
    return body


DEEP = b"[" * 50_000 + b"]" * 50_000
MP = "multipart/form-data; boundary=XB"


@pytest.mark.parametrize(("ctype", "body", "says"), [
    ("multipart/form-data", b"x", "boundary"),
    (MP, b"garbage", "multipart"),
    (MP, b"--XB\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nxx\r\n--XB--\r\n", "name"),
    (MP, b"".join(b"--XB\r\nContent-Disposition: form-data; name=\"f%d\"\r\n\r\nx\r\n" % i for i in range(1100))
     + b"--XB--\r\n", "fields"),
])
def test_malformed_multipart_uploads_are_400(e2b_server: Server, box, ctype: str, body: bytes, says: str) -> None:
    r = httpx.post(f"{e2b_server.url}/files", content=body, headers={**_headers(box, 49983), "Content-Type": ctype})
    assert says in _not_500(r, 400)["message"]


def test_deeply_nested_json_is_400(e2b_server: Server, box) -> None:
    r = httpx.post(f"{e2b_server.url}/sandboxes", headers={"X-API-KEY": e2b_server.token_a},
                   content=b'{"templateID":"base","metadata":' + DEEP + b"}")
    assert "nested too deeply" in _not_500(r, 400)["message"]
    for path in ("/execute", "/contexts"):
        r = httpx.post(f"{e2b_server.url}{path}", content=b'{"code":' + DEEP + b"}", headers=_headers(box, 49999))
        assert "nested too deeply" in _not_500(r, 400)["message"]


def test_huge_or_odd_port_headers_are_not_500(e2b_server: Server, box) -> None:
    for port in ("9" * 4301, "\u00b2"):
        r = httpx.get(f"{e2b_server.url}/healthz",
                      headers={"E2b-Sandbox-Id": "doesnotexist", "E2b-Sandbox-Port": port.encode("latin-1")})
        _not_500(r, 502)  # unknown sandbox, before any auth: what E2B's edge answers
        odd = {**_headers(box, 0), "E2b-Sandbox-Port": port.encode("latin-1")}
        r = httpx.get(f"{e2b_server.url}/health", headers=odd)
        assert "nothing listens" in _not_500(r, 404)["message"]


def test_lone_surrogates_are_400_sb002(e2b_server: Server, box) -> None:
    v1 = {"Authorization": f"Bearer {e2b_server.token_a}", "Content-Type": "application/json"}
    for path, raw in (("/v1/sandbox/write", b'{"session_id":"sur","path":"a","content":"\\ud800"}'),
                      ("/v1/sandbox/execute", b'{"session_id":"sur","code":"#\\ud800"}'),
                      ("/v1/sandbox/bash", b'{"session_id":"sur","command":"true","env":{"X":"\\ud800"}}')):
        r = httpx.post(e2b_server.url + path, content=raw, headers=v1, timeout=60)
        err = _not_500(r, 400)["error"]
        assert err["code"] == "SB002" and "surrogate" in err["message"], err
    r = httpx.post(f"{e2b_server.url}/execute", content=b'{"code": "#\\ud800"}', headers=_headers(box, 49999))
    assert "surrogate" in _not_500(r, 400)["message"]
    assert box.run_code("'fine'").text == "'fine'"


def test_echoed_ids_and_template_names_are_clipped(e2b_server: Server) -> None:
    r = httpx.get(f"{e2b_server.url}/health", headers={"E2b-Sandbox-Id": "x" * 10_000})
    assert len(_not_500(r, 502)["message"]) < 200
    r = httpx.get(f"{e2b_server.url}/sandboxes/{'y' * 5000}", headers={"X-API-KEY": e2b_server.token_a})
    assert len(_not_500(r, 404)["message"]) < 200
    r = httpx.post(f"{e2b_server.url}/sandboxes", headers={"X-API-KEY": e2b_server.token_a},
                   json={"templateID": "t" * 10_000})
    assert len(_not_500(r, 404)["message"]) < 400


def test_code_contexts_are_capped_and_cwd_is_a_workspace_path(e2b_server: Server) -> None:
    sbx = ci.Sandbox.create(timeout=120, api_key=e2b_server.token_a)
    try:
        url, h = e2b_server.url, _headers(sbx, 49999)
        for bad in ({"cwd": "x" * 30_000}, {"cwd": {"a": 1}}, {"cwd": 5}, {"cwd": "/etc"}, {"cwd": "../up"}):
            r = httpx.post(f"{url}/contexts", json={"language": "python", **bad}, headers=h)
            assert "cwd" in _not_500(r, 400)["message"], bad
        sbx.files.make_dir("/home/user/sub")  # a context's cwd must exist
        ctx = sbx.create_code_context(cwd="/home/user/sub")
        assert ctx.cwd == "/home/user/sub"
        made = 1
        while made < 16:
            r = httpx.post(f"{url}/contexts", json={"language": "python"}, headers=h)
            if r.status_code != 200:
                break
            made += 1
        assert made == 16
        r = httpx.post(f"{url}/contexts", json={"language": "python"}, headers=h)
        assert "SB008" in _not_500(r, 429)["message"]
        assert len(httpx.get(f"{url}/contexts", headers=h).json()) == 16
        sbx.remove_code_context(ctx)  # room again
        assert sbx.create_code_context().id
    finally:
        sbx.kill()


def test_a_sandbox_whose_session_was_destroyed_is_gone(e2b_server: Server) -> None:
    sbx = ci.Sandbox.create(timeout=120, api_key=e2b_server.token_a)
    sbx.files.write("keep.txt", "important")
    admin = {"Authorization": f"Bearer {e2b_server.admin_token}"}
    r = httpx.delete(f"{e2b_server.url}/v1/sandbox/sessions/alpha/e2b-{sbx.sandbox_id}", headers=admin)
    assert r.status_code == 200, r.text
    assert not sbx.is_running()
    listed = e2b.Sandbox.list(api_key=e2b_server.token_a).next_items()
    assert sbx.sandbox_id not in [s.sandbox_id for s in listed]
    with pytest.raises(e2b.SandboxException):  # not a fresh, empty workspace
        sbx.files.read("keep.txt")
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.connect(sbx.sandbox_id, api_key=e2b_server.token_a)
    r = httpx.get(f"{e2b_server.url}/v1/sandbox/sessions/alpha/e2b-{sbx.sandbox_id}", headers=admin)
    assert r.status_code == 404  # nothing made the session again
    assert e2b.Sandbox.kill(sbx.sandbox_id, api_key=e2b_server.token_a) is False
