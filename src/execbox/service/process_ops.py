"""The steps of a background-process request, for the HTTP routes (``routes/processes.py``) and
the MCP tools (``mcp/processes.py``) alike.

Both work on one ``ProcessTable`` per replica, so a process started through one is listed, read,
fed and signalled through the other; they differ only in how a request arrives (a body, a tool's
arguments) and how the answer is shaped. Here: the session's box for one operation (never creating
the session, except to start a process), the checks, the agent calls and the audit rows. The
in-box agent runs the process; nothing here runs code. Every operation first lets the table adopt
the processes an earlier service left in the box (``ProcessTable.adopt``: once per box).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidConfigError, PayloadTooLargeError, RateLimitError, SandboxError
from ..providers.base import SandboxProvider
from .background import OPERATION, BgProcess, ProcessTable, no_call, start_meta, supports
from .executions import RunService, RunSpec
from .routes.sandbox import check_path
from .sessions import notes

if TYPE_CHECKING:
    from .sessions.manager import SessionManager

MAX_STDIN_BYTES = 1024 * 1024
"""Bytes one stdin write may carry."""
KILL_SETTLE = 2.0
"""Seconds a SIGKILL's answer waits for the process's end to be seen, so it says ``running: false``."""
NOT_CREATED = "only starting a process creates a session; the other process requests never do"
"""Why a process request other than the start answers 404 for an unknown session."""
PROCESS_LANGUAGE = "process"
"""The ``language`` label and audit value of stdin writes and signals (they run no interpreter)."""


def require_support(provider: SandboxProvider) -> None:
    if not supports(provider):
        raise InvalidConfigError(
            f"provider {provider.name!r} does not support background processes; they work on the "
            "self-hosted providers (jail, docker, kubernetes)", http_status=501,
            details={"provider": provider.name, "reason": "background_processes_unsupported"})


@dataclass
class ProcessOps:
    """One replica's process requests: its sessions, audit and process table."""

    sessions: SessionManager
    runs: RunService
    table: ProcessTable

    def start(self, tenant: str, session_id: str, token_id: str | None, command: str, cwd: str | None,
              env: dict[str, str] | None, stdin: bool, timeout: float | None) -> BgProcess:
        """Start ``bash -c command`` in the session's box (created on first use), followed and
        audited; the caller has checked the command's size against its own limit."""
        if not command.strip() or "\x00" in command:
            raise InvalidConfigError("command must be a non-empty string without NUL", details={"field": "command"})
        check_path(cwd, "cwd")
        with self.sessions.box_for_operation(tenant, session_id, "bash", count_execution=True) as (provider, iid):
            require_support(provider)
            limit = provider.config.get("max_timeout")
            if timeout is not None and limit and timeout > float(limit):
                raise InvalidConfigError(f"timeout {timeout:g}s exceeds this provider's maximum of {limit}s",
                                         details={"field": "timeout", "max": limit})
            self.table.adopt(provider, tenant, session_id, iid)
            cap = self.table.max_per_session
            if self.table.running(tenant, session_id, iid) >= cap:
                raise RateLimitError(f"too many background processes running in this session (max {cap}, "
                                     "SANDBOX_MAX_BACKGROUND_PROCESSES); wait for or signal one first",
                                     details={"limit": cap, "reason": "max_background_processes"})
            spec = RunSpec(tenant, session_id, OPERATION, "bash", command, token_id, no_call)
            started, started_at = time.monotonic(), time.time()
            where = None if cwd in (None, "", ".") else cwd
            # filed as started before it starts: the box keeps the key, so whoever adopts the
            # process later ends this filing with its audit row
            spec.inflight = self.runs.oplog.begin(
                tenant_id=tenant, session_id=session_id, provider=provider.name, operation=OPERATION,
                instance_id=iid, language="bash", code=command, token_id=token_id)
            # its public id: its pid in the box, or an alias when that pid is an id the session's
            # table holds (a process of its earlier box): the plan goes in the meta for an adopter
            plan = self.table.id_plan(tenant, session_id)
            meta = start_meta(tenant, session_id, cwd, stdin, timeout, started_at, spec.inflight, plan)
            try:
                box_pid = provider.start_process(iid, command, cwd=where, env=env, stdin=stdin, meta=meta)
            except SandboxError as e:
                self.runs.record(spec, provider.name, iid, started, "error", None, e.code)
                raise
            proc = BgProcess(box_pid, command, cwd, tenant, session_id, provider, iid, stdin, timeout,
                             started_at=started_at, started_mono=started)
            self.table.add(proc, spec, plan)
        return proc

    def listing(self, tenant: str, session_id: str) -> list[BgProcess]:
        """The session's processes: running ones and recently ended ones. A paused session has
        none (its box is gone), and a look must not resume it (an MCP client polling the list kept
        paused sessions awake)."""
        if self._paused(tenant, session_id):
            return []
        with notes.collecting(create=False, refusal=NOT_CREATED), \
                self.sessions.box_for_operation(tenant, session_id, "bash") as (provider, iid):
            require_support(provider)
            self.table.adopt(provider, tenant, session_id, iid)
            return self.table.of_box(tenant, session_id, iid)

    def _paused(self, tenant: str, session_id: str) -> bool:
        if self.sessions.beside_run(tenant, session_id) is not None:
            return False
        loaded = self.sessions.get(tenant, session_id)
        if loaded is not None and not loaded.closed:
            return loaded.state == "paused"
        row = self.sessions.registry.get(tenant, session_id)
        return row is not None and row.state == "paused"

    def find(self, tenant: str, session_id: str, pid: int) -> BgProcess:
        """The session's process whose public id is ``pid``: 404 naming ``pid`` for one it does not
        have. The agent calls on it name its ``box_pid``."""
        with notes.collecting(create=False, refusal=NOT_CREATED), \
                self.sessions.box_for_operation(tenant, session_id, "bash") as (provider, iid):
            require_support(provider)
            self.table.adopt(provider, tenant, session_id, iid)
            proc = self.table.get(tenant, session_id, iid, pid)
        if proc is None:
            raise InvalidConfigError(f"no background process {pid} in session {session_id}", http_status=404,
                                     details={"field": "pid", "pid": pid, "session_id": session_id})
        return proc

    def _record(self, proc: BgProcess, operation: str, what: str, token_id: str | None, started: float,
                status: str, error_code: str | None = None) -> None:
        spec = RunSpec(proc.tenant_id, proc.session_id, operation, PROCESS_LANGUAGE, what, token_id, no_call)
        self.runs.record(spec, proc.provider.name, proc.instance_id, started, status, None, error_code)

    def write_input(self, tenant: str, session_id: str, token_id: str | None, pid: int, data: bytes,
                    close: bool, field: str = "data") -> BgProcess:
        """Write ``data`` to the process's stdin and/or close it (``field``: the argument named in a
        refusal of its size)."""
        if len(data) > MAX_STDIN_BYTES:
            raise PayloadTooLargeError(f"stdin data is {len(data)} bytes; the limit is {MAX_STDIN_BYTES} per request",
                                       details={"field": field, "size": len(data), "limit": MAX_STDIN_BYTES})
        proc = self.find(tenant, session_id, pid)  # may wait for the session: no slot held meanwhile
        with self.sessions.execution_slot(tenant):
            if not proc.info()["stdin"]:
                why = (f"has ended{f' ({proc.error})' if proc.error else ''}" if proc.ended
                       else "has its stdin closed" if proc.stdin_closed
                       else "was started without stdin (start it with stdin: true)")
                raise InvalidConfigError(f"process {pid} {why}", http_status=409, details={"field": "pid", "pid": pid})
            started = time.monotonic()
            try:
                if data:
                    proc.provider.process_input(proc.instance_id, proc.box_pid, data)
                if close:
                    proc.provider.close_process_input(proc.instance_id, proc.box_pid)
                    with proc.cond:
                        proc.stdin, proc.stdin_closed = False, True
            except SandboxError as e:
                self._record(proc, "process_stdin", f"pid {pid}", token_id, started, "error", e.code)
                if e.http_status == 404:  # it ended (and was read to its end) just now
                    raise InvalidConfigError(f"process {pid} has ended", http_status=409,
                                             details={"field": "pid", "pid": pid}) from None
                raise
            self._record(proc, "process_stdin", f"pid {pid}", token_id, started, "success")
        return proc

    def signal(self, tenant: str, session_id: str, token_id: str | None, pid: int,
               sig: str) -> tuple[BgProcess, bool]:
        """Send ``sig`` to the process's job; (the process, whether a signal was delivered: False for
        one that had ended or been SIGKILLed already). After a SIGKILL, waits up to ``KILL_SETTLE``
        for its end to be seen."""
        proc = self.find(tenant, session_id, pid)  # may wait for the session: no slot held meanwhile
        with self.sessions.execution_slot(tenant):
            signalled = False
            started = time.monotonic()
            with proc.cond:
                over = proc.ended or proc.killed  # a SIGKILL was delivered: it is gone, its end not yet seen
            if not over:
                try:
                    signalled = proc.provider.signal_process(proc.instance_id, proc.box_pid, sig)
                except SandboxError as e:
                    if e.http_status != 404:  # 404: it ended (and was read to its end) just now
                        self._record(proc, "process_signal", f"{sig} pid {pid}", token_id, started, "error", e.code)
                        raise
                if signalled and sig == "SIGKILL":
                    with proc.cond:
                        proc.killed = True
            self._record(proc, "process_signal", f"{sig} pid {pid}", token_id, started, "success")
        with proc.cond:
            if proc.killed:  # its end comes with the follower's next poll: answer with it
                proc.cond.wait_for(lambda: proc.ended, KILL_SETTLE)
        return proc, signalled
