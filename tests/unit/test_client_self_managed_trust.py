"""self_managed trusts nothing the remote executor claims about artifacts, and never shows tenants
the executor's endpoint (the operator's internal address) in an error: only the server log has it."""

from __future__ import annotations

import base64
import hashlib
import json
import logging

import pytest

from execbox.errors import SandboxError
from execbox.providers.self_managed import SelfManagedProvider, run_response_to_result
from tests.unit.remote.http_server import free_port

from .client_fakes import answer, in_thread, trickle_body

KW = {"provider": "self_managed", "instance_id": "i", "wall": 0.1, "default_isolation": "container"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a/../../b", "a\x00b", "", None, 7,
                                  "C:\\x", "\\\\host\\share"])
def test_unsafe_artifact_names_are_dropped_with_a_note(name):
    body = {"status": "success", "artifacts": [{"name": name, "content_b64": b64(b"x")},
                                                {"name": "plot.png", "content_b64": b64(b"png")}]}
    r = run_response_to_result(body, **KW)
    assert [a.name for a in r.artifacts] == ["plot.png"]
    assert len(r.metadata["artifact_problems"]) == 1


def test_artifact_size_and_sha256_come_from_the_bytes():
    data = b"A" * 3000
    body = {"status": "success", "artifacts": [{"name": "out/data.bin", "size": 1, "sha256": "0" * 64,
                                                "mime_type": "text/plain", "content_b64": b64(data)}]}
    [a] = run_response_to_result(body, **KW).artifacts
    assert a.name == a.path == "out/data.bin"
    assert a.size == 3000 and a.sha256 == hashlib.sha256(data).hexdigest()
    assert a.read_bytes() == data and a.mime_type == "text/plain"


def test_artifact_names_are_normalised():
    body = {"status": "success", "artifacts": [{"name": "./a//b.txt", "content_b64": b64(b"1")}]}
    assert [a.name for a in run_response_to_result(body, **KW).artifacts] == ["a/b.txt"]


def test_undecodable_artifact_is_dropped_not_an_exception():
    body = {"status": "success", "artifacts": [{"name": "x", "content_b64": "!!notb64"}, "junk"]}
    r = run_response_to_result(body, **KW)
    assert r.artifacts == [] and len(r.metadata["artifact_problems"]) == 2


# -- the endpoint stays out of tenant-visible errors ---------------------------------------------------


def _leaks(err: SandboxError, port: int) -> bool:
    shown = json.dumps(err.to_dict(), default=str)
    return str(port) in shown or "127.0.0.1" in shown


def _run(url: str, api: str = "run", timeout: float = 5) -> SandboxError:
    p = SelfManagedProvider()
    p.initialize({"endpoint": url, "max_retries": 0, "api": api})
    inst = p.create_instance()
    try:
        with pytest.raises(SandboxError) as e:
            p.execute_code(inst.instance_id, "print(1)", "python", timeout)
        return e.value
    finally:
        p.shutdown()


@pytest.mark.parametrize("api", ["run", "execbox"])
def test_connect_failure_does_not_name_the_endpoint_but_the_log_does(api, caplog):
    port = free_port()
    with caplog.at_level(logging.INFO, logger="execbox.provider.self_managed"):
        err = _run(f"http://127.0.0.1:{port}", api)
    assert err.code == "SB003" and "remote executor" in err.message
    assert not _leaks(err, port)
    if api == "run":
        assert str(port) in caplog.text  # the operator still sees which endpoint failed


@pytest.mark.parametrize("status, body", [("500 Oops", "x"), ("200 OK", "<html/>"), ("200 OK", "[]"),
                                          ("401 Unauthorized", "{}"), ("422 Unprocessable", '{"detail": "bad"}')])
def test_http_answers_do_not_name_the_endpoint(serve, status, body):
    srv = serve(answer(body, status))
    err = _run(srv.url)
    assert not _leaks(err, srv.port)


def test_a_late_answer_does_not_name_the_endpoint(serve, monkeypatch):
    from execbox.providers import self_managed

    monkeypatch.setattr(self_managed, "HTTP_GRACE", 0.3)
    srv = serve(trickle_body)
    err, _, _ = in_thread(lambda: _run(srv.url, timeout=0.5), 15)
    assert err.code == "SB005" and not _leaks(err, srv.port)
