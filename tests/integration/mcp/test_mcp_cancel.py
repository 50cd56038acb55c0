"""A client cancelling a tool call stops the run it started (review 31), on a real `execbox serve`
(jail boxes): the handshake-era client sends `notifications/cancelled`, the sessionless one closes
its response stream. The spinning cell is interrupted as `interrupt_run` would do it (its context
keeps its state), so the session serves the next call at once instead of after the cell's timeout.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

SPIN = "import time\nwhile True:\n    time.sleep(0.05)"
TIMEOUT = 60


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_cancelling_a_call_interrupts_its_run(service, mode: str) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a, mode=mode) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            await c.call_tool("run_code", {"session_id": sid, "code": "rows = [1, 2, 3]"})
            with anyio.move_on_after(2) as scope:  # the client gives up on the call: it cancels it
                await c.call_tool("run_code", {"session_id": sid, "code": SPIN, "timeout": TIMEOUT})
            started = time.monotonic()
            after = await c.call_tool("run_code", {"session_id": sid, "code": "print(sum(rows))"})
            took = time.monotonic() - started
            await c.call_tool("close_session", {"session_id": sid})
            return {"cancelled": scope.cancelled_caught, "after": after, "took": took}

    out = run_async(go)
    assert out["cancelled"]
    assert out["took"] < 20, out["took"]  # the spin was stopped, not left to run to its 60 s timeout
    assert not out["after"].is_error and out["after"].structured_content["stdout"] == "6\n"  # state kept


def test_cancelling_a_command_stops_it(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_b, mode="legacy") as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            with anyio.move_on_after(2):
                await c.call_tool("run_command", {"session_id": sid, "command": "sleep 100", "timeout": TIMEOUT})
            started = time.monotonic()
            ps = await c.call_tool("run_command", {"session_id": sid, "command": "pgrep -c -x sleep || true"})
            took = time.monotonic() - started
            await c.call_tool("close_session", {"session_id": sid})
            return {"ps": ps, "took": took}

    out = run_async(go)
    assert out["took"] < 20, out["took"]
    assert out["ps"].structured_content["stdout"].strip() == "0"  # the command's process tree is gone
