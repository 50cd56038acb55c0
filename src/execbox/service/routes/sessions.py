"""Session lifecycle routes of the gateway API: list, look at, close, destroy, pause, resume.

Mounted beside routes/sandbox.py (under /v1/sandbox and bare). ``DELETE`` and the list are
admin only (the gateway contract); ``POST .../close`` is the same teardown for the session's own
tenant, so a tenant that opens a session per task can end it and free its quota slot at once.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request

from ...errors import InvalidConfigError
from ..auth import Principal, require_admin, require_token
from ..container import services
from ..schemas import ERROR_RESPONSES, DestroyedOut, SessionOut, SessionsOut
from ..sessions import NAME_PATTERN, SessionManager
from .sandbox import tenant_for

router = APIRouter(responses=ERROR_RESPONSES)


def _sessions(request: Request) -> SessionManager:
    return services(request).sessions


def _name_path() -> Any:
    """A fresh Path() per parameter (FastAPI binds a FieldInfo to one parameter name)."""
    return Path(pattern=NAME_PATTERN, max_length=64)


@router.get("/sessions", response_model=SessionsOut, summary="List sessions (admin only)")
def list_sessions(request: Request, tenant_id: str | None = Query(default=None, pattern=NAME_PATTERN,
                                                                    max_length=64),
                  principal: Principal = Depends(require_admin)) -> Any:
    return {"sessions": _sessions(request).list(tenant_id)}


@router.delete("/sessions/{tenant_id}/{session_id}", response_model=DestroyedOut,
               summary="Destroy a session, its box and its workspace (admin only)")
def destroy_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                    principal: Principal = Depends(require_admin)) -> Any:
    return {"destroyed": _sessions(request).destroy(tenant_id, session_id, "deleted")}


@router.post("/sessions/{tenant_id}/{session_id}/close", response_model=DestroyedOut,
             summary="Close a session: stop what runs, destroy its box and workspace (its own tenant, or admin)")
def close_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                  principal: Principal = Depends(require_token)) -> Any:
    """What DELETE does, for the session's own tenant too: its quota slot is free at once. 404
    for a session that does not exist (never used, or already ended)."""
    return {"destroyed": _sessions(request).destroy(tenant_for(principal, tenant_id), session_id, "closed")}


@router.post("/sessions/{tenant_id}/{session_id}/interrupt", summary="Interrupt the session's running run "
             "(a context's cell keeps its state), whoever started it")
def interrupt_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                      principal: Principal = Depends(require_token)) -> Any:
    """As a notebook's interrupt: the run in progress ends as cancelled (a Python or JavaScript
    context's cell with its context kept); ``interrupted`` is False when nothing was running."""
    tenant = tenant_for(principal, tenant_id)
    return {"tenant_id": tenant, "session_id": session_id,
            "interrupted": _sessions(request).interrupt(tenant, session_id)}


@router.get("/sessions/{tenant_id}/{session_id}", response_model=SessionOut,
            summary="One session: state, owning replica, expiry")
def get_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                principal: Principal = Depends(require_token)) -> Any:
    return _sessions(request).info(tenant_for(principal, tenant_id), session_id)


@router.post("/sessions/{tenant_id}/{session_id}/pause", response_model=SessionOut,
             summary="Pause a session: stop its box (CPU, memory freed), keep its files until retention ends")
def pause_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                  principal: Principal = Depends(require_token)) -> Any:
    return _sessions(request).pause(tenant_for(principal, tenant_id), session_id)


@router.post("/sessions/{tenant_id}/{session_id}/resume", response_model=SessionOut,
             summary="Resume a paused session under the same id (its box starts now)")
def resume_session(request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
                   principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    sessions = _sessions(request)
    if sessions.info(tenant, session_id)["state"] != "paused":
        raise InvalidConfigError(f"session {tenant}/{session_id} is not paused", http_status=409,
                                 details={"tenant_id": tenant, "session_id": session_id, "reason": "not_paused"})
    return sessions.resume(tenant, session_id)
