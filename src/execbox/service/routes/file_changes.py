"""Workspace changes beside read and write: delete, make a directory, move.

- POST /v1/sandbox/delete   {session_id, path}                  a file, or a directory with what it holds
- POST /v1/sandbox/mkdir    {session_id, path}                  a directory and its parents
- POST /v1/sandbox/move     {session_id, source, destination}   rename or move, within the workspace

The in-box agent does the work (``files.delete``, ``files.mkdir``, ``files.move``; the E2B
facade's ``files.remove``/``make_dir``/``rename`` use the same ops), every path checked by the one
path validator (the agent refuses the workspace root itself). Each is one file operation of the
session, counted and audited as ``write`` is, and served beside a run. A provider whose boxes
have no agent (E2B, AgentRun, RAGFlow's /run) answers 501 naming it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from ...providers.agent_files import workspace_change
from ..auth import Principal, require_token
from ..container import services
from ..schemas import ERROR_RESPONSES, SessionFileRequest
from .sandbox import check_path, tenant_for

router = APIRouter(responses=ERROR_RESPONSES)


class PathRequest(SessionFileRequest):
    path: str = Field(min_length=1, max_length=4096)


class MoveRequest(SessionFileRequest):
    source: str = Field(min_length=1, max_length=4096)
    destination: str = Field(min_length=1, max_length=4096)


class DeletedOut(BaseModel):
    path: str
    deleted: bool = True


class MadeDirOut(BaseModel):
    path: str
    created: bool  # False: it was a directory already


class MovedOut(BaseModel):
    source: str
    path: str  # where it is now


@router.post("/delete", response_model=DeletedOut, summary="Delete a file, or a directory and what it holds")
def delete(body: PathRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    services(request).runs.file_op(
        tenant, body.session_id, "delete_path", body.path, principal.token_id,
        lambda p, i: workspace_change(p, "delete_path", "delete workspace files")(i, body.path))
    return {"path": body.path, "deleted": True}


@router.post("/mkdir", response_model=MadeDirOut, summary="Make a directory and its parents")
def mkdir(body: PathRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    created = services(request).runs.file_op(
        tenant, body.session_id, "make_dir", body.path, principal.token_id,
        lambda p, i: workspace_change(p, "make_dir", "make workspace directories")(i, body.path))
    return {"path": body.path, "created": bool(created)}


@router.post("/move", response_model=MovedOut, summary="Move or rename a file or directory within the workspace")
def move(body: MoveRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.source, "source")
    check_path(body.destination, "destination")
    where = services(request).runs.file_op(
        tenant, body.session_id, "move_path", body.source, principal.token_id,
        lambda p, i: workspace_change(p, "move_path", "move workspace files")(i, body.source, body.destination))
    return {"source": body.source, "path": where}
