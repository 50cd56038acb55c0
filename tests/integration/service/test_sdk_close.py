"""The SDK's close() ends the session with a tenant token too (it was a no-op: DELETE is admin
only), and a client used after close() says so with SandboxClosedError (SB002), not an SB000
"bug" (review 29, findings 4 and 11)."""

from __future__ import annotations

import asyncio

import pytest

from execbox import AsyncRemoteSandbox, RemoteSandbox, Sandbox, SandboxClosedError

from .conftest import Service


def test_a_tenant_tokens_close_frees_the_session_and_its_quota_slot(service_factory) -> None:
    svc: Service = service_factory(tenant_max_sessions=1)
    sessions = svc.app.state.services.sessions
    for task in range(3):  # a session per task, one slot: each close must free it
        with RemoteSandbox.create(svc.url, svc.tenant_a, session_id=f"task-{task}") as sb:
            assert sb.run_code("print(6 * 7)").stdout == "42\n"
        assert sessions.registry.get("tenant-a", f"task-{task}") is None

    async def main() -> None:
        sb = await AsyncRemoteSandbox.create(svc.url, svc.tenant_a, session_id="async-task")
        assert (await sb.run_code("print(1)")).stdout == "1\n"
        await sb.close()

    asyncio.run(main())
    assert sessions.registry.get("tenant-a", "async-task") is None
    RemoteSandbox.create(svc.url, svc.tenant_a, session_id="never-used").close()  # 404: nothing to end, no raise


def _closed(call) -> SandboxClosedError:
    with pytest.raises(SandboxClosedError) as caught:
        call()
    e = caught.value
    assert e.code == "SB002" and e.details["reason"] == "closed" and "is closed" in e.message
    return e


def test_using_a_closed_remote_sandbox_is_sb002_sandbox_closed(service: Service) -> None:
    sb = RemoteSandbox.create(service.url, service.tenant_a, session_id="done")
    sb.run_code("1")
    sb.close()
    e = _closed(lambda: sb.run_code("1"))
    assert e.details["session_id"] == "done" and "create a new RemoteSandbox" in e.message
    _closed(lambda: sb.run_code("1", on_output=lambda *_: None))  # the streamed path too
    _closed(lambda: sb.files.write("a.txt", "a"))

    async def main() -> None:
        asb = await AsyncRemoteSandbox.create(service.url, service.tenant_a)
        await asb.close()
        for call in (lambda: asb.run_code("1"), lambda: asb.run_code("1", on_output=lambda *_: None)):
            with pytest.raises(SandboxClosedError):
                await call()

    asyncio.run(main())


def test_using_a_closed_local_sandbox_is_sb002_sandbox_closed(jail_provider) -> None:
    sb = Sandbox.create(jail_provider)
    sb.close()
    _closed(lambda: sb.run_code("1"))
