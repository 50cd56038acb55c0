"""A malformed or foreign reply (a proxy's HTML page, a redirect, wrong JSON shapes, undecodable
fields) is a typed SandboxError from every client (SDK sync and async, self_managed, the session
CLI): never a JSONDecodeError, KeyError, AttributeError, ValueError or binascii.Error."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from execbox import RemoteSandbox
from execbox.cli import app
from execbox.errors import ConnectionFailedError, ProviderUnavailableError, SandboxError
from execbox.providers.self_managed import SelfManagedProvider, run_response_to_result
from execbox.sdk.remote_async import AsyncRemoteSandbox

from .client_fakes import answer

JSON_REPLIES = {
    "html": "<html>login</html>",
    "list": "[]",
    "string": '"ok"',
    "exit_code": '{"exit_code": "abc"}',
    "stdout_list": '{"stdout": ["a"]}',
    "bad_base64": '{"artifacts": [{"name": "x", "content_b64": "!!notb64"}]}',
    "nameless_artifact": '{"artifacts": [{"nom": "x"}]}',
    "artifacts_string": '{"artifacts": "abc"}',
}
SSE_REPLIES = {
    "bad_json": "event: stdout\ndata: {not json\n\n",
    "list_data": "event: stdout\ndata: []\n\n",
    "text_not_str": 'event: stdout\ndata: {"text": 5}\n\n',
    "error_string": 'event: error\ndata: "boom"\n\n',
    "result_list": "event: result\ndata: [1]\n\n",
    "error_bad_details": 'event: error\ndata: {"code": "SB002", "details": "notadict"}\n\n',
}
ERROR_REPLIES = {
    "error_string": ("400 Bad Request", '{"error": "just a string"}'),
    "details_string": ("400 Bad Request", '{"error": {"code": "SB002", "details": "notadict"}}'),
    "html_502": ("502 Bad Gateway", "<html>bad gateway</html>"),
}


def _typed(err: BaseException | None) -> SandboxError:
    assert isinstance(err, SandboxError), f"untyped {type(err).__name__}: {err}"
    return err


@pytest.mark.parametrize("body", JSON_REPLIES.values(), ids=JSON_REPLIES.keys())
def test_sdk_malformed_run_reply_is_sb003(serve, body):
    srv = serve(answer(body))
    with pytest.raises(ConnectionFailedError, match="not a valid execbox reply"):
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)")


@pytest.mark.parametrize("body", JSON_REPLIES.values(), ids=JSON_REPLIES.keys())
def test_async_sdk_malformed_run_reply_is_sb003(serve, body):
    srv = serve(answer(body))

    async def go():
        sb = AsyncRemoteSandbox(srv.url, "tok", tenant_id="t")
        try:
            await sb.run_code("print(1)")
        finally:
            await sb._http.aclose()

    with pytest.raises(ConnectionFailedError, match="not a valid execbox reply"):
        asyncio.run(go())


@pytest.mark.parametrize("frames", SSE_REPLIES.values(), ids=SSE_REPLIES.keys())
def test_sdk_malformed_event_stream_is_typed(serve, frames):
    srv = serve(answer(frames, ctype="text/event-stream"))
    with pytest.raises(SandboxError) as e:
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)", on_output=lambda s, t: None)
    _typed(e.value)

    async def go():
        sb = AsyncRemoteSandbox(srv.url, "tok", tenant_id="t")
        try:
            await sb.run_code("print(1)", on_output=lambda s, t: None)
        finally:
            await sb._http.aclose()

    with pytest.raises(SandboxError):
        asyncio.run(go())


@pytest.mark.parametrize("status, body", ERROR_REPLIES.values(), ids=ERROR_REPLIES.keys())
def test_sdk_malformed_error_reply_is_typed(serve, status, body):
    srv = serve(answer(body, status))
    with pytest.raises(SandboxError) as e:
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)")
    assert e.value.http_status == int(status.split()[0])
    assert e.value.code != "SB000"  # a foreign or malformed error reply is not an execbox bug


@pytest.mark.parametrize("call", ["read", "read_bytes", "list", "glob", "grep", "write"])
def test_sdk_file_calls_check_reply_shapes(serve, call):
    srv = serve(answer('{"content_b64": "!!", "files": "x", "paths": [1], "matches": [1], "path": 3}'))
    files = RemoteSandbox(srv.url, "tok", tenant_id="t").files
    args = {"read": ("x",), "read_bytes": ("x",), "list": (), "glob": ("*",), "grep": ("x",),
            "write": ("x", "data")}[call]
    with pytest.raises(ConnectionFailedError, match="not a valid execbox reply"):
        getattr(files, call)(*args)


def test_sdk_does_not_follow_a_redirect(serve):
    leak = serve(answer('{"stdout": "stolen"}'))
    srv = serve(answer("", "307 Temporary Redirect", "text/plain", f"Location: {leak.url}/steal\r\n"))
    with pytest.raises(ConnectionFailedError, match="HTTP 307 redirect.*not followed"):
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)")
    with pytest.raises(ConnectionFailedError, match="HTTP 307 redirect"):
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)", on_output=lambda s, t: None)
    assert leak.requests == []


@pytest.mark.parametrize("command", ["pause", "resume", "rm"])
@pytest.mark.parametrize("status, body", [("200 OK", "<html>login</html>"), ("200 OK", "[1]"),
                                          ("400 Bad Request", '{"error": "str"}'),
                                          ("307 Temporary Redirect", "")])
def test_session_cli_prints_an_sb_error_not_a_traceback(serve, monkeypatch, command, status, body):
    monkeypatch.delenv("EXECBOX_URL", raising=False)
    srv = serve(answer(body, status))
    r = CliRunner().invoke(app, ["session", command, "t", "s", "--url", srv.url, "--token", "SECRET-tok"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "execbox: SB" in r.output and "Traceback" not in r.output and "SECRET-tok" not in r.output


def test_session_cli_shows_a_non_numeric_expiry_as_text(serve, monkeypatch):
    monkeypatch.delenv("EXECBOX_URL", raising=False)
    srv = serve(answer(json.dumps({"expires_at": "soon"})))
    r = CliRunner().invoke(app, ["session", "pause", "t", "s", "--url", srv.url, "--token", "x"])
    assert r.exit_code == 0 and "soon" in r.output


# -- self_managed: the /run answer's fields ---------------------------------------------------------

KW = {"provider": "self_managed", "instance_id": "i", "wall": 0.1, "default_isolation": "container"}


@pytest.mark.parametrize("field, value", [("exit_code", "abc"), ("exit_code", True), ("stdout", ["a"]),
                                          ("stderr", 5), ("time_used_ms", "slow"), ("memory_used_kb", {}),
                                          ("result", [1]), ("artifacts", "abc"), ("detail", 3)])
def test_self_managed_malformed_field_is_sb009_naming_it(field, value):
    with pytest.raises(ProviderUnavailableError) as e:
        run_response_to_result({"status": "success", field: value}, **KW)
    assert e.value.details["field"] == field


def test_self_managed_unknown_isolation_claim_falls_back_to_the_class_tier():
    r = run_response_to_result({"status": "success", "isolation": "bulletproof"}, **KW)
    assert r.metadata["isolation"] == "container"
    assert run_response_to_result({"status": "success", "isolation": "gvisor"}, **KW).metadata["isolation"] == "gvisor"


@pytest.mark.parametrize("status, body", [("200 OK", "<html>x</html>"), ("200 OK", "[1]"),
                                          ("307 Temporary Redirect", ""), ("500 Oops", '{"error": "str"}'),
                                          ("200 OK", '{"status": "program_runner_error", "error": "str"}'),
                                          ("200 OK", '{"status": "program_runner_error", '
                                                     '"error": {"code": "SB004", "details": "x"}}')])
def test_self_managed_foreign_answers_are_typed(serve, status, body):
    srv = serve(answer(body, status))
    p = SelfManagedProvider()
    p.initialize({"endpoint": srv.url, "max_retries": 0})
    inst = p.create_instance()
    with pytest.raises(SandboxError) as e:
        p.execute_code(inst.instance_id, "print(1)", "python", 5)
    _typed(e.value)
    if status.startswith("307"):
        assert "redirect, not followed" in e.value.message
