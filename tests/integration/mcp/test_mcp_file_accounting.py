"""MCP file tools take the service's run path: metered, audited, refused over the tenant's quota."""

from __future__ import annotations

from typing import Any

from tests.integration.service.conftest import slots_taken

from .conftest import http_client, run_async


def test_mcp_file_tools_are_metered_audited_and_quota_bound(service) -> None:
    svc = service.app.state.services

    async def write(sid: str | None, path: str) -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            if sid is None:
                sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            return sid, await c.call_tool("write_file", {"session_id": sid, "path": path, "content": "m"})

    sid, ok = run_async(write, None, "m.txt")
    assert not ok.is_error
    svc.audit.flush()
    [row] = [r for r in svc.store.audit.list(tenant_id="tenant-a") if r["operation"] == "write_file"]
    assert row["session_id"] == sid and row["status"] == "success" and row["token_id"].startswith("tok_")
    metric = svc.metrics.registry.get_sample_value(
        "execbox_file_operations_total", {"operation": "write_file", "status": "success"})
    assert metric == 1.0

    with slots_taken(svc.sessions, "tenant-a", svc.settings.tenant_max_executions):  # every one of them
        _, refused = run_async(write, sid, "over.txt")
    assert refused.is_error and "SB008" in str(refused.content)
    _, listing = run_async(write, sid, "after.txt")  # the slot is free again
    assert not listing.is_error
    assert svc.metrics.registry.get_sample_value(
        "execbox_file_operations_total", {"operation": "write_file", "status": "error"}) == 1.0
