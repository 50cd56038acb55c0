"""Listing workspaces for MCP's resources/list never resumes a paused session, starts a box, or
creates a session (SessionManager.if_running and ServiceCore.list_running_files), on the local provider."""

from __future__ import annotations

from typing import Any

from execbox.mcp.core import Caller, ServiceCore
from execbox.service.config import ServiceSettings
from execbox.service.executions import RunService
from execbox.service.logs import OperationLog
from execbox.service.metrics import ServiceMetrics
from execbox.service.sessions import SessionManager
from tests.integration.service.conftest import Holder


def _core(provider: Any, root: str) -> tuple[SessionManager, ServiceCore]:
    settings = ServiceSettings()
    sessions = SessionManager(Holder(provider), settings, root, None)
    runs = RunService(sessions, ServiceMetrics(), OperationLog(None, settings.audit_code))
    return sessions, ServiceCore(sessions, runs, settings.default_timeout)


def test_paused_session_is_not_resumed_by_a_listing(local_provider, tmp_path) -> None:
    sessions, core = _core(local_provider, str(tmp_path))
    caller = Caller("t")
    for sid in ("awake", "asleep"):
        core.create_session(caller, sid)
        core.write_file(caller, sid, f"{sid}.txt", sid, "overwrite")
    sessions.pause("t", "asleep")
    asleep = sessions.get("t", "asleep")
    assert asleep is not None and asleep.state == "paused" and asleep.instance_id is None
    boxes, last_used = asleep.boxes_started, asleep.last_used

    assert "awake.txt" in [f.path for f in core.list_running_files(caller, "awake") or []]
    assert core.list_running_files(caller, "asleep") is None
    assert core.list_running_files(caller, "never-made") is None
    assert asleep.state == "paused" and asleep.instance_id is None and asleep.boxes_started == boxes
    assert asleep.last_used == last_used and asleep.busy == 0
    assert sessions.registry.get("t", "asleep").state == "paused"
    assert sessions.get("t", "never-made") is None and sessions.registry.get("t", "never-made") is None

    with sessions.if_running("t", "asleep") as s:
        assert s is None
    with sessions.if_running("t", "awake") as s:
        assert s is not None and s.instance_id is not None and s.busy == 1
    assert sessions.get("t", "awake").busy == 0
    sessions.shutdown()
