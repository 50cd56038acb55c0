"""interrupt_run through MCP on a real `execbox serve` (jail boxes): a long cell running in one tool
call is interrupted by another, ends marked interrupted, and its context keeps its state."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

SPIN = "import time\nwhile True:\n    time.sleep(0.05)"


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_an_interrupted_cell_ends_interrupted_and_the_context_keeps_its_state(service) -> None:
    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out["idle"] = await c.call_tool("interrupt_run", {"session_id": sid})
            await c.call_tool("run_code", {"session_id": sid, "code": "rows = [1, 2, 3]"})

            async def spin() -> None:
                started = time.monotonic()
                out["spin"] = await c.call_tool("run_code", {"session_id": sid, "code": SPIN, "timeout": 30})
                out["spin_seconds"] = time.monotonic() - started

            async with anyio.create_task_group() as tg:
                tg.start_soon(spin)
                await anyio.sleep(1.5)  # the cell is running
                out["interrupt"] = await c.call_tool("interrupt_run", {"session_id": sid})
            out["after"] = await c.call_tool("run_code", {"session_id": sid, "code": "print(sum(rows))"})
            out["missing"] = await c.call_tool("interrupt_run", {"session_id": "no-such-session"})
            await c.call_tool("close_session", {"session_id": sid})
        return out

    out = run_async(go)
    assert out["idle"].structured_content["interrupted"] is False and "nothing was running" in _text(out["idle"])
    assert out["interrupt"].structured_content["interrupted"] is True, _text(out["interrupt"])
    spin = out["spin"]
    assert out["spin_seconds"] < 20  # it ended at the interrupt, not at its 30 s timeout
    assert spin.structured_content["interrupted"] is True and spin.structured_content["metadata"]["cancelled"]
    assert spin.structured_content["timed_out"] is False
    text = _text(spin)
    assert "interrupted: the run was stopped before it finished" in text and "KeyboardInterrupt" in text
    assert "its state is kept" in text
    assert out["after"].structured_content["stdout"] == "6\n"  # names defined before are still there
    err = out["missing"].structured_content["error"]
    assert out["missing"].is_error and err["code"] == "SB002" and err["details"]["session_id"] == "no-such-session"
