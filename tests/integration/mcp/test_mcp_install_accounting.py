"""The MCP install_packages tool takes the service's run path, as the HTTP install route does:
one audit row (operation ``install``, language ``packages``), the ``execbox_executions`` metric,
and the tenant's execution slot (SB008 when the tenant's slots are all taken)."""

from __future__ import annotations

from typing import Any

from tests.integration.service.conftest import slots_taken

from .conftest import http_client, run_async


def test_mcp_install_is_audited_metered_and_quota_bound(service) -> None:
    svc = service.app.state.services

    async def install(sid: str | None) -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            if sid is None:
                sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            return sid, await c.call_tool("install_packages", {"session_id": sid, "pip": ["httpx"]})

    def packages_metric(status: str) -> float:
        return svc.metrics.registry.get_sample_value(
            "execbox_executions_total", {"provider": "jail", "language": "packages", "status": status}) or 0.0

    before = packages_metric("error")
    sid, offline = run_async(install, None)  # this service's box has no network: the install fails
    assert offline.is_error and "without network" in offline.structured_content["error"]["message"]
    svc.audit.flush()
    [row] = [r for r in svc.store.audit.list(tenant_id="tenant-a")
             if r["operation"] == "install" and r["session_id"] == sid]
    assert row["language"] == "packages" and row["status"] == "error"
    assert row["token_id"].startswith("tok_")
    assert packages_metric("error") == before + 1

    with slots_taken(svc.sessions, "tenant-a", svc.settings.tenant_max_executions):  # every one of them
        _, refused = run_async(install, sid)
    assert refused.is_error and refused.structured_content["error"]["code"] == "SB008"
