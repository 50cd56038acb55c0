"""Background processes in a session (docs/http-api.md, "Background processes").

- POST /v1/sandbox/sessions/{tenant_id}/{session_id}/processes              start one: 201 {pid, ...}
- GET  /v1/sandbox/sessions/{tenant_id}/{session_id}/processes              the session's processes
- GET  /v1/sandbox/sessions/{tenant_id}/{session_id}/processes/{pid}        output past offsets (long-poll)
- POST /v1/sandbox/sessions/{tenant_id}/{session_id}/processes/{pid}/stdin  write (and/or close) stdin
- POST /v1/sandbox/sessions/{tenant_id}/{session_id}/processes/{pid}/signal send a signal to its job

Mounted under /v1/sandbox and bare, like routes/sessions.py. A process runs in the session's box
on its own (service/background.py): it does not hold the session, so runs, file operations and
other processes go on beside it, and these requests reach the box beside a run that holds the
session. Only ``POST .../processes`` creates a session that does not exist; the others answer 404
for one. A request for a session another replica owns is forwarded there like any session request
(the owner keeps the process's output). Providers without background processes (the remote and
cloud ones) answer 501 SB002 naming the provider.

``{pid}`` is a process's public id (``pid`` in its answers): its pid in the box (``box_pid``),
unless the session's table held that number already (a process of the session's earlier box,
kept as ``lost``), when it is an alias above 2**22 (service/bg_adopt.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...errors import InvalidConfigError
from ..auth import Principal, require_token
from ..background import SIGNALS, ProcessTable
from ..container import Services, services
from ..process_ops import ProcessOps
from ..schemas import ERROR_RESPONSES
from ..sessions import NAME_PATTERN
from .sandbox import _check_size, tenant_for

router = APIRouter(responses=ERROR_RESPONSES)

MAX_WAIT = 60.0
"""Longest long-poll (``wait``) one GET may ask for, in seconds."""

Signal = Literal["SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]
assert set(Signal.__args__) == set(SIGNALS)  # type: ignore[attr-defined]


def _name() -> Any:
    return Path(pattern=NAME_PATTERN, max_length=64)


def _pid() -> Any:
    return Path(ge=1, le=2**31 - 1, description="The process's id, `pid` in the answer of POST .../processes (its pid "
                                                "in the box, `box_pid`, unless that was taken in the session)")


# -- shapes ----------------------------------------------------------------------------------------


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(description="Run as `bash -c COMMAND` in the workspace")
    cwd: str | None = Field(default=None, max_length=4096, description="Relative to the workspace")
    env: dict[str, str] | None = None
    stdin: bool = Field(default=False, description="Keep stdin open for POST .../stdin (else it reads EOF)")
    timeout: float | None = Field(default=None, gt=0, le=86400,
                                  description="Seconds after which the whole job is killed (status timed_out); "
                                              "at most the provider's max_timeout. Default: none, it lives "
                                              "as long as the session (or until signalled)")


class StdinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: str | None = Field(default=None, description="Text, written as UTF-8")
    data_b64: str | None = Field(default=None, description="Bytes, base64-encoded")
    close: bool = Field(default=False, description="Close stdin after writing (the process reads EOF)")


class SignalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signal: Signal = Field(default="SIGTERM", description="Sent to the process's whole job (its process group); "
                                                          "SIGKILL kills its process tree")

    @field_validator("signal", mode="before")
    @classmethod
    def _normalize(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().upper()
            return v if v.startswith("SIG") else f"SIG{v}"
        return v


class ProcessOut(BaseModel):
    model_config = ConfigDict(extra="allow")  # what a state adds (adopted, over_tenant_cap, exited_in_box, ...)
    pid: int = Field(description="The id of the process in the session, for the other routes: its pid in the box, "
                                 "or an alias above 2**22 when that pid is an id the session still holds")
    box_pid: int = Field(description="Its pid in the box (equal to pid unless pid is an alias)")
    command: str
    cwd: str | None = None
    running: bool
    status: Literal["running", "exited", "signalled", "timed_out", "lost"]
    exit_code: int | None = Field(description="Once ended: the exit code, -N for a process killed by signal N")
    signal: int | None = None
    timed_out: bool
    error: str | None = Field(default=None, description="Why the process was lost (its box ended under it)")
    stdin: bool = Field(description="Whether stdin takes input now")
    timeout: float | None = None
    started_at: float
    ended_at: float | None = None


class ProcessesOut(BaseModel):
    tenant_id: str
    session_id: str
    processes: list[ProcessOut]


class OutputOut(ProcessOut):
    encoding: Literal["text", "base64"]
    stdout: str
    stderr: str
    stdout_offset: int = Field(description="The stdout_offset to ask for next")
    stderr_offset: int = Field(description="The stderr_offset to ask for next")
    stdout_skipped: int = Field(description="Bytes before the first returned one that are no longer held "
                                            "(a larger offset acknowledged them earlier)")
    stderr_skipped: int
    stdout_dropped: int = Field(0, description="Bytes of an ended process's output that were never read and "
                                               "are no longer held (only its last SANDBOX_BACKGROUND_ENDED_TAIL_BYTES "
                                               "are kept); counted in stdout_skipped too")
    stderr_dropped: int = 0


class StdinOut(BaseModel):
    pid: int
    written: int
    stdin: bool


class SignalOut(BaseModel):
    pid: int
    signal: str
    signalled: bool
    running: bool


# -- helpers ---------------------------------------------------------------------------------------


def _table(svc: Services) -> ProcessTable:
    table = svc.processes
    assert table is not None, "install() sets it"
    return table


def _ops(svc: Services) -> ProcessOps:
    return ProcessOps(svc.sessions, svc.runs, _table(svc))


# -- routes ----------------------------------------------------------------------------------------


@router.post("/sessions/{tenant_id}/{session_id}/processes", status_code=201, response_model=ProcessOut,
             summary="Start a background process in a session (it does not hold the session)")
def start_process(body: StartIn, request: Request, tenant_id: str = _name(), session_id: str = _name(),
                  principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    svc = services(request)
    _check_size(body.command, "command", svc.settings.max_code_bytes)
    proc = _ops(svc).start(tenant, session_id, principal.token_id, body.command, body.cwd, body.env, body.stdin,
                           body.timeout)
    return JSONResponse(proc.info(), status_code=201)


@router.get("/sessions/{tenant_id}/{session_id}/processes", response_model=ProcessesOut,
            summary="A session's background processes: running ones and recently ended ones")
def list_processes(request: Request, tenant_id: str = _name(), session_id: str = _name(),
                   principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    svc = services(request)
    procs = _ops(svc).listing(tenant, session_id)
    return {"tenant_id": tenant, "session_id": session_id, "processes": [p.info() for p in procs]}


@router.get("/sessions/{tenant_id}/{session_id}/processes/{pid}", response_model=OutputOut,
            summary="A background process's new output past the offsets, and its state (long-poll with wait)")
async def read_process(request: Request, tenant_id: str = _name(), session_id: str = _name(), pid: int = _pid(),
                       stdout_offset: int = Query(default=0, ge=0, le=2**62,
                                                  description="Bytes of stdout already read"),
                       stderr_offset: int = Query(default=0, ge=0, le=2**62,
                                                  description="Bytes of stderr already read"),
                       encoding: Literal["text", "base64"] = Query(
                           default="text", description="text: UTF-8 (invalid bytes replaced); base64: raw bytes"),
                       wait: float = Query(default=0, ge=0, le=MAX_WAIT,
                                           description="Seconds to wait for new output or the end when there is "
                                                       "none yet"),
                       principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    svc = services(request)
    proc = await anyio.to_thread.run_sync(_ops(svc).find, tenant, session_id, pid)
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    while True:
        got = proc.read(stdout_offset, stderr_offset)
        left = until - loop.time()
        if got["stdout"] or got["stderr"] or not proc.info()["running"] or left <= 0:
            break
        await proc.wait_change(got["version"], left)
    del got["version"]
    for stream in ("stdout", "stderr"):
        data = got[stream]
        got[stream] = data.decode("utf-8", "replace") if encoding == "text" else base64.b64encode(data).decode()
    return JSONResponse({**proc.info(), "encoding": encoding, **got})


@router.post("/sessions/{tenant_id}/{session_id}/processes/{pid}/stdin", response_model=StdinOut,
             summary="Write to a background process's stdin (started with stdin: true), and/or close it")
def write_stdin(body: StdinIn, request: Request, tenant_id: str = _name(), session_id: str = _name(),
                pid: int = _pid(), principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    svc = services(request)
    if body.data is not None and body.data_b64 is not None:
        raise InvalidConfigError("give data or data_b64, not both", details={"field": "data"})
    if body.data is None and body.data_b64 is None and not body.close:
        raise InvalidConfigError("give data or data_b64 (or close: true)", details={"field": "data"})
    if body.data_b64 is not None:
        try:
            data = base64.b64decode(body.data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidConfigError("data_b64 is not valid base64", details={"field": "data_b64"}) from None
    else:
        data = (body.data or "").encode("utf-8", "surrogatepass")
    proc = _ops(svc).write_input(tenant, session_id, principal.token_id, pid, data, body.close,
                                 "data_b64" if body.data_b64 is not None else "data")
    return {"pid": pid, "written": len(data), "stdin": proc.info()["stdin"]}


@router.post("/sessions/{tenant_id}/{session_id}/processes/{pid}/signal", response_model=SignalOut,
             summary="Send a signal to a background process's job (SIGTERM by default)")
def signal_process(body: SignalIn, request: Request, tenant_id: str = _name(), session_id: str = _name(),
                   pid: int = _pid(), principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    svc = services(request)
    proc, signalled = _ops(svc).signal(tenant, session_id, principal.token_id, pid, body.signal)
    return {"pid": pid, "signal": body.signal, "signalled": signalled, "running": proc.info()["running"]}


# -- registration ----------------------------------------------------------------------------------


def _ids(prefix: str):  # noqa: ANN202
    def unique_id(route: APIRoute) -> str:
        return f"{prefix}{route.name}"

    return unique_id


def install(app: FastAPI, svc: Services) -> None:
    """The process table (one per app) and the routes, under /v1/sandbox and bare."""
    svc.processes = ProcessTable(svc.runs, svc.settings.max_background_processes)
    app.include_router(router, prefix="/v1/sandbox", tags=["processes"], generate_unique_id_function=_ids("v1_"))
    app.include_router(router, tags=["processes (direct)"], generate_unique_id_function=_ids(""))
