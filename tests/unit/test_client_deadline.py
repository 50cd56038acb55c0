"""A run's whole HTTP exchange ends by its timeout + grace (SB005), however the server paces its
bytes: httpx's timeouts are per read, so a trickle or endless keep-alives never trip them alone.

Grace is shrunk (monkeypatched) so each case takes about a second; each runs on a thread that the
test abandons after 15 s, so a client with no overall deadline fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio

import pytest

from execbox import RemoteSandbox
from execbox.errors import ConnectionFailedError, ExecutionTimeoutError
from execbox.providers import self_managed
from execbox.providers.self_managed import SelfManagedProvider
from execbox.sdk import wire
from execbox.sdk.remote_async import AsyncRemoteSandbox

from .client_fakes import in_thread, keepalives_forever, trickle_body, trickle_headers

LIMIT = 15.0


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(wire, "HTTP_GRACE", 0.5)
    monkeypatch.setattr(self_managed, "HTTP_GRACE", 0.5)


def _timed_out(err: BaseException | None, took: float, deadline: float) -> None:
    assert isinstance(err, ExecutionTimeoutError), repr(err)
    assert err.code == "SB005"
    assert deadline - 0.1 <= took < deadline + 2.0


@pytest.mark.parametrize("handler", [trickle_body, trickle_headers], ids=["body", "headers"])
def test_sdk_run_ends_at_its_deadline_while_bytes_trickle(serve, handler):
    srv = serve(handler)
    sb = RemoteSandbox(srv.url, "tok-SECRET", tenant_id="t")
    _, err, took = in_thread(lambda: sb.run_code("print(1)", timeout=0.5), LIMIT)
    _timed_out(err, took, 1.0)
    assert "tok-SECRET" not in str(err)


def test_sdk_streamed_run_ends_at_its_deadline_despite_keepalives(serve):
    srv = serve(keepalives_forever)
    sb = RemoteSandbox(srv.url, "tok", tenant_id="t")
    _, err, took = in_thread(lambda: sb.run_code("print(1)", timeout=0.5, on_output=lambda s, t: None), LIMIT)
    _timed_out(err, took, 1.0)


def test_async_sdk_run_ends_at_its_deadline(serve):
    srv = serve(trickle_body)

    async def go():
        sb = AsyncRemoteSandbox(srv.url, "tok", tenant_id="t")
        try:
            return await sb.run_code("print(1)", timeout=0.5)
        finally:
            await sb._http.aclose()

    _, err, took = in_thread(lambda: asyncio.run(go()), LIMIT)
    _timed_out(err, took, 1.0)


def test_async_streamed_run_ends_at_its_deadline(serve):
    srv = serve(keepalives_forever)

    async def go():
        sb = AsyncRemoteSandbox(srv.url, "tok", tenant_id="t")
        try:
            return await sb.run_code("print(1)", timeout=0.5, on_output=lambda s, t: None)
        finally:
            await sb._http.aclose()

    _, err, took = in_thread(lambda: asyncio.run(go()), LIMIT)
    _timed_out(err, took, 1.0)


def test_sdk_file_call_is_bounded_too(serve, monkeypatch):
    from execbox.sdk import remote

    monkeypatch.setattr(remote, "CALL_DEADLINE", 1.0)
    srv = serve(trickle_body)
    sb = RemoteSandbox(srv.url, "tok", tenant_id="t")
    _, err, took = in_thread(lambda: sb.files.read("x.txt"), LIMIT)
    assert isinstance(err, ConnectionFailedError) and err.code == "SB003", repr(err)
    assert took < 4


@pytest.mark.parametrize("handler", [trickle_body, trickle_headers], ids=["body", "headers"])
def test_self_managed_run_ends_at_timeout_plus_grace(serve, handler):
    srv = serve(handler)
    p = SelfManagedProvider()
    p.initialize({"endpoint": srv.url, "max_retries": 0})
    inst = p.create_instance()
    try:
        _, err, took = in_thread(lambda: p.execute_code(inst.instance_id, "print(1)", "python", 1), LIMIT)
    finally:
        p.shutdown()
    _timed_out(err, took, 1.5)
    assert str(srv.port) not in str(err) and str(srv.port) not in repr(err.details)
