"""resources/list lists the files of running sessions only: it never resumes a paused session or
starts a box, and leaves a paused session's idle clock alone."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail


def test_resources_list_does_not_resume_paused_sessions(service) -> None:
    sessions = service.app.state.services.sessions

    async def make() -> None:
        async with http_client(service.url, service.tenant_a) as c:
            for sid in ("live", "napping"):
                await c.call_tool("create_session", {"session_id": sid})
                await c.call_tool("write_file", {"session_id": sid, "path": f"{sid}.txt", "content": sid})

    async def listing() -> list[Any]:
        async with http_client(service.url, service.tenant_a) as c:
            return (await c.list_resources()).resources

    run_async(make)
    sessions.pause("tenant-a", "napping")
    paused = sessions.get("tenant-a", "napping")
    assert paused is not None and paused.state == "paused" and paused.instance_id is None
    started, last_used = paused.boxes_started, paused.last_used

    uris = {str(r.uri) for r in run_async(listing)}
    assert "execbox://sessions/live/files/live.txt" in uris  # a running session is listed
    assert not any("/napping/" in u for u in uris)
    after = sessions.get("tenant-a", "napping")
    assert after is paused and after.state == "paused" and after.instance_id is None
    assert after.boxes_started == started and after.last_used == last_used
    assert sessions.registry.get("tenant-a", "napping").state == "paused"
