"""Every /v1/sandbox endpoint on a real service (uvicorn + jail), through raw HTTP and RemoteSandbox."""

from __future__ import annotations

import base64
import hashlib
import shutil

import pytest

from execbox import RemoteSandbox, execute_code
from tests.conftest import require

from .conftest import Service, error_of


def test_execute_in_session_keeps_workspace_and_reports_jail(service: Service) -> None:
    c = service.a
    r = c.post("/v1/sandbox/execute", json={"code": "open('n.txt','w').write('7')\nprint('hi')",
                                            "session_id": "api-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stdout"] == "hi\n" and body["exit_code"] == 0
    assert body["tenant_id"] == "tenant-a" and body["session_id"] == "api-1"
    assert body["metadata"]["isolation"] == "jail" and body["metadata"]["provider"] == "jail"
    r = c.post("/v1/sandbox/execute", json={"code": "print(open('n.txt').read())", "session_id": "api-1"})
    assert r.json()["stdout"] == "7\n"


def test_bare_paths_serve_the_same_api(service: Service) -> None:
    r = service.a.post("/execute", json={"code": "echo $((6*7))", "language": "bash", "session_id": "api-1"})
    assert r.status_code == 200 and r.json()["stdout"] == "42\n"


def test_one_shot_execute_gets_a_fresh_box_each_time(service: Service) -> None:
    c = service.a
    sessions_before = service.app.state.services.sessions.count()
    first = c.post("/v1/sandbox/execute", json={"code": "open('x','w').write('1'); print('ok')"}).json()
    second = c.post("/v1/sandbox/execute",
                    json={"code": "import os; print(os.path.exists('x'))"}).json()
    assert first["stdout"] == "ok\n" and second["stdout"] == "False\n"
    assert first["session_id"] is None and first["metadata"]["instance_id"] != second["metadata"]["instance_id"]
    assert service.app.state.services.sessions.count() == sessions_before  # one-shots hold no session
    assert not service.jail_instances(first["metadata"]["instance_id"], second["metadata"]["instance_id"])


def test_languages_arguments_and_result(service: Service) -> None:
    c = service.a
    py = c.post("/v1/sandbox/execute", json={"code": "def main(a, b):\n    return {'sum': a + b}",
                                             "arguments": {"a": 2, "b": 3}}).json()
    assert py["result"] == {"sum": 5}
    require(shutil.which("node") is not None, "node (JavaScript runtime)")
    js = c.post("/v1/sandbox/execute", json={"code": "function main(args) { return args.n * 2 }",
                                             "language": "nodejs", "arguments": {"n": 21}})
    assert js.status_code == 200 and js.json()["result"] == 42, js.text
    sh = c.post("/v1/sandbox/execute", json={"code": "echo $((2 + 2))", "language": "bash"}).json()
    assert sh["stdout"] == "4\n"


def test_context_id_keeps_globals(service: Service) -> None:
    c = service.a
    c.post("/v1/sandbox/execute", json={"code": "x = 41", "session_id": "ctx", "context_id": "c1"})
    r = c.post("/v1/sandbox/execute", json={"code": "print(x + 1)", "session_id": "ctx", "context_id": "c1"})
    assert r.json()["stdout"] == "42\n"


def test_bash_with_cwd_and_env(service: Service) -> None:
    c = service.a
    c.post("/v1/sandbox/write", json={"session_id": "sh", "path": "sub/f.txt", "content": "x"})
    r = c.post("/v1/sandbox/bash", json={"session_id": "sh", "command": "pwd; ls; echo $GREETING",
                                         "cwd": "sub", "env": {"GREETING": "hello"}})
    assert r.status_code == 200, r.text
    out = r.json()["stdout"].splitlines()
    assert out[0].endswith("/sub") and out[1] == "f.txt" and out[2] == "hello"


def test_file_operations(service: Service) -> None:
    c = service.a
    s = {"session_id": "files"}
    w = c.post("/v1/sandbox/write", json={**s, "path": "docs/a.txt", "content": "alpha\nbeta\ngamma\n"})
    assert w.status_code == 200 and w.json()["size"] == 17
    c.post("/v1/sandbox/write", json={**s, "path": "docs/a.txt", "content": "delta\n", "mode": "append"})
    page = c.post("/v1/sandbox/read", json={**s, "path": "docs/a.txt", "offset": 1, "limit": 2}).json()
    assert page["content"] == "beta\ngamma\n" and page["total_lines"] == 4 and page["truncated"]
    blob = bytes(range(256))
    c.post("/v1/sandbox/write", json={**s, "path": "b.bin", "content_b64": base64.b64encode(blob).decode()})
    rb = c.post("/v1/sandbox/read_binary", json={**s, "path": "b.bin"}).json()
    assert base64.b64decode(rb["content_b64"]) == blob and rb["sha256"] == hashlib.sha256(blob).hexdigest()
    g = c.post("/v1/sandbox/grep", json={**s, "pattern": "^(beta|delta)$"}).json()
    assert [(m["path"], m["line_number"]) for m in g["matches"]] == [("docs/a.txt", 2), ("docs/a.txt", 4)]
    assert c.post("/v1/sandbox/glob", json={**s, "pattern": "**/*.txt"}).json()["paths"] == ["docs/a.txt"]
    listed = c.post("/v1/sandbox/list", json={**s, "path": ".", "recursive": True}).json()["files"]
    assert {f["path"] for f in listed} >= {"docs", "docs/a.txt", "b.bin"}
    exists = c.post("/v1/sandbox/write", json={**s, "path": "b.bin", "content": "x", "mode": "create"})
    assert exists.status_code == 409 and error_of(exists)["code"] == "SB002"


def test_copy_is_all_or_nothing(service: Service) -> None:
    c = service.a
    url = "/v1/sandbox/sessions/tenant-a/copy-s/copy"
    ok = c.post(url, json={"files": [{"path": "in/1.txt", "content": "one"},
                                     {"path": "in/2.bin", "content_b64": base64.b64encode(b"\0\1").decode()}]})
    assert ok.status_code == 200, ok.text
    assert [f["path"] for f in ok.json()["files"]] == ["in/1.txt", "in/2.bin"]
    bad = c.post(url, json={"files": [{"path": "in/3.txt", "content": "three"},
                                      {"path": "../escape.txt", "content": "no"}]})
    assert bad.status_code == 400 and error_of(bad)["details"]["field"] == "files.1.path"
    # a failure only the box can see (a file where a directory is): still nothing written
    bad = c.post(url, json={"files": [{"path": "in/3.txt", "content": "three"},
                                      {"path": "in/1.txt/x", "content": "no"}]})
    assert 400 <= bad.status_code < 500, bad.text
    paths = c.post("/v1/sandbox/glob", json={"session_id": "copy-s", "pattern": "in/*"}).json()["paths"]
    assert paths == ["in/1.txt", "in/2.bin"]  # 3.txt was not written


def test_artifacts_are_listed_and_fetchable(service: Service) -> None:
    c = service.a
    code = "import os\nos.makedirs('artifacts', exist_ok=True)\nopen('artifacts/r.csv','w').write('a,b\\n1,2\\n')"
    r = c.post("/v1/sandbox/execute", json={"code": code, "session_id": "art"}).json()
    [art] = r["artifacts"]
    assert art["name"] == "r.csv" and art["mime_type"] == "text/csv" and art.get("content_b64") is None
    data = c.post("/v1/sandbox/read_binary", json={"session_id": "art", "path": art["path"]}).json()
    assert base64.b64decode(data["content_b64"]) == b"a,b\n1,2\n"
    once = c.post("/v1/sandbox/execute", json={"code": code}).json()  # one-shot: bytes inline
    assert base64.b64decode(once["artifacts"][0]["content_b64"]) == b"a,b\n1,2\n"


def test_admin_lists_and_destroys_sessions(service: Service) -> None:
    service.b.post("/v1/sandbox/execute", json={"code": "open('f','w').write('1')", "session_id": "gone"})
    listed = service.root.get("/v1/sandbox/sessions", params={"tenant_id": "tenant-b"}).json()["sessions"]
    assert [s["session_id"] for s in listed] == ["gone"] and listed[0]["provider"] == "jail"
    d = service.root.delete("/v1/sandbox/sessions/tenant-b/gone")
    assert d.status_code == 200 and d.json()["destroyed"]["session_id"] == "gone"
    assert service.root.get("/v1/sandbox/sessions", params={"tenant_id": "tenant-b"}).json()["sessions"] == []
    again = service.b.post("/v1/sandbox/execute", json={"code": "import os; print(os.path.exists('f'))",
                                                        "session_id": "gone"})
    assert again.json()["stdout"] == "False\n"  # recreated on use, with a fresh workspace
    assert error_of(service.root.delete("/v1/sandbox/sessions/tenant-b/never"))["code"] == "SB002"


def test_remote_sandbox_matches_local_sandbox_api(service: Service) -> None:
    with RemoteSandbox.create(service.url, service.tenant_a) as sb:
        sb.files.write("data.txt", "hello")
        assert sb.run_code("print(open('data.txt').read())").stdout == "hello\n"
        assert sb.files.read("data.txt").content == "hello"
        assert sb.files.read_bytes("data.txt") == b"hello"
        assert sb.files.glob("*.txt") == ["data.txt"]
        assert sb.files.grep("ell")[0].line == "hello"
        written = sb.files.write_many({"m/1.txt": "1", "m/2.bin": b"\x00"})
        assert [f.path for f in written] == ["m/1.txt", "m/2.bin"]
        assert {f.path for f in sb.files.list("m")} == {"m/1.txt", "m/2.bin"}
        assert sb.run_command("cat m/1.txt").stdout == "1"
        chunks: list[tuple[str, str]] = []
        res = sb.run_code("print('a', flush=True)", on_output=lambda s, t: chunks.append((s, t)))
        assert res.stdout == "a\n" and chunks == [("stdout", "a\n")]
        slow = sb.run_code("import time; print('x', flush=True); time.sleep(5)", timeout=0.5)
        assert slow.timed_out and slow.error_code == "SB005" and slow.stdout == "x\n"
        code = "import os\nos.makedirs('artifacts', exist_ok=True)\nopen('artifacts/p.txt','w').write('P')"
        assert sb.run_code(code).artifacts[0].read_bytes() == b"P"


def test_execute_code_by_url(service: Service) -> None:
    res = execute_code("print(sum(range(10)))", url=service.url, token=service.tenant_b)
    assert res.stdout == "45\n" and res.metadata["isolation"] == "jail"


def test_async_client(service: Service) -> None:
    import asyncio

    from execbox import AsyncRemoteSandbox

    async def go() -> tuple[str, str, list[str]]:
        async with await AsyncRemoteSandbox.create(service.url, service.tenant_a) as sb:
            await sb.files.write("q.txt", "async")
            seen: list[str] = []
            r = await sb.run_code("print(open('q.txt').read())", on_output=lambda s, t: seen.append(t))
            cmd = await sb.run_command("echo ok")
            return r.stdout, cmd.stdout, seen

    # A fresh thread: another suite's sync Playwright may own this thread's running event loop.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        out, cmd, seen = pool.submit(asyncio.run, go()).result()
    assert out == "async\n" and cmd == "ok\n" and "".join(seen) == "async\n"


@pytest.mark.parametrize("prefix", ["/v1/sandbox", ""])
def test_openapi_lists_both_mounts(service: Service, prefix: str) -> None:
    paths = service.client().get("/openapi.json").json()["paths"]
    for p in ("execute", "bash", "read", "read_binary", "write", "grep", "glob", "sessions",
              "sessions/{tenant_id}/{session_id}", "sessions/{tenant_id}/{session_id}/copy"):
        assert f"{prefix}/{p}" in paths


def test_remote_close_destroys_the_session_with_an_admin_or_its_tenants_token(service: Service) -> None:
    sessions = service.app.state.services.sessions
    with RemoteSandbox.create(service.url, service.admin, tenant_id="tenant-b", session_id="closing") as sb:
        sb.run_code("1")
        assert sessions.get("tenant-b", "closing") is not None
    assert sessions.get("tenant-b", "closing") is None
    with RemoteSandbox.create(service.url, service.tenant_b, session_id="kept") as sb:
        sb.run_code("1")
        assert sessions.get("tenant-b", "kept") is not None
    assert sessions.get("tenant-b", "kept") is None  # POST .../close: the tenant's own token ends it too
    assert sessions.registry.get("tenant-b", "kept") is None
