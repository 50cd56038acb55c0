"""Background commands of a remote sandbox as the service's background processes.

``RemoteSandbox.commands.run(cmd, background=True)`` starts a process through the HTTP routes
(``POST .../processes``) and returns a handle that long-polls its output: the process holds
neither the session nor a worker, so other calls on the sandbox go on beside it. The handles
subclass the ones in ``commands`` (same surface), so code written for either works with both.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any, Protocol

from ..errors import SandboxError
from ..models import ExecutionResult
from ..providers.base import OutputCallback
from ..providers.output_cap import OUTPUT_CAP
from .commands import KILLED_EXIT_CODE, AsyncCommandHandle, CommandHandle, _Output
from .wire import Reply, decode, reply_error

POLL_WAIT = 10.0
"""Seconds one long-poll of a remote background process waits for output (GET .../processes/{pid}?wait=)."""
POLL_RETRIES = 3
"""Failed polls in a row (service unreachable) before the handle gives up and wait() raises the error."""
KEPT_OUTPUT = OUTPUT_CAP
"""UTF-8 bytes of each stream a handle keeps in ``stdout``/``stderr`` (the head, ``truncated`` past
it): a held run's cap, the providers' default ``max_output_bytes`` (1 MiB). A process may write
without end; ``on_output`` still gets every chunk."""

Read = dict[str, Any]


class _ProcessOps(Protocol):
    def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int, wait: float) -> Read: ...

    def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> Read: ...


class _AsyncProcessOps(Protocol):
    async def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int, wait: float) -> Read: ...

    async def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> Read: ...


class _Follow:
    """The state both process handles share: offsets, output, and the result once it ended."""

    def __init__(self, pid: int, on_output: OutputCallback | None) -> None:
        self.pid = pid
        self.out = _Output(on_output, KEPT_OUTPUT)
        self.offsets = (0, 0)
        self.failures = 0

    def take(self, got: Read) -> bool:
        """Take one read's output; True once the process has ended (the result is set then)."""
        self.failures = 0
        for stream in ("stdout", "stderr"):
            if got.get(stream):
                self.out(stream, got[stream])
        self.offsets = (int(got["stdout_offset"]), int(got["stderr_offset"]))
        if got.get("running"):
            return False
        meta: dict[str, Any] = {"pid": self.pid, "status": got.get("status"), "signal": got.get("signal")}
        if got.get("timed_out"):
            meta["error_code"] = "SB005"
        if got.get("error"):
            meta["error_message"] = got["error"]
        code = got.get("exit_code")
        ended, started = got.get("ended_at"), got.get("started_at")
        timed = isinstance(ended, (int, float)) and isinstance(started, (int, float))
        seconds = float(ended - started) if timed else 0.0
        self.out.result = ExecutionResult(self.out.stdout, self.out.stderr,
                                          int(code) if code is not None else KILLED_EXIT_CODE, seconds,
                                          metadata=meta, timed_out=bool(got.get("timed_out")),
                                          truncated=self.out.truncated)
        return True

    def failed(self, e: BaseException) -> bool:
        """A poll failed; True when the handle gives up (wait() raises ``e``)."""
        self.failures += 1
        if self.failures > POLL_RETRIES or not isinstance(e, SandboxError) or e.code in ("SB002",):
            self.out.error = e
            return True
        return False


class ProcessHandle(CommandHandle):
    """A background command that is a background process of the service's session
    (``RemoteSandbox.commands.run(..., background=True)``): it does not hold the session, so other
    calls on the sandbox go on while it runs. Same surface as CommandHandle, plus ``pid`` and
    ``send_stdin``/``close_stdin`` (for a command started with ``stdin=True``). A thread
    long-polls its output; ``stdout``/``stderr`` grow as it comes. A CommandHandle subclass, so
    code that checks for one keeps working."""

    def __init__(self, ops: _ProcessOps, pid: int, on_output: OutputCallback | None) -> None:
        # not CommandHandle.__init__: there is no held run to consume
        self._ops = ops
        self._f = _Follow(pid, on_output)
        self._out = self._f.out  # what the inherited stdout, stderr, exit_code and wait() read
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"execbox-process-{pid}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            while True:
                try:
                    got = self._ops._process_read(self.pid, *self._f.offsets, POLL_WAIT)
                except BaseException as e:  # noqa: BLE001 - handed to wait() once retries are spent
                    if self._f.failed(e):
                        return
                    time.sleep(0.5 * self._f.failures)
                    continue
                if self._f.take(got):
                    return
        finally:
            self._done.set()

    @property
    def pid(self) -> int:
        return self._f.pid

    def send_stdin(self, data: str | bytes) -> None:
        """Write to the command's stdin (it must have been started with ``stdin=True``)."""
        self._ops._process_post(self.pid, "stdin", _stdin_body(data))

    def close_stdin(self) -> None:
        self._ops._process_post(self.pid, "stdin", {"close": True})

    def signal(self, name: str = "SIGTERM") -> bool:
        """Send a signal to the command's job; whether it was delivered (False once it ended)."""
        return bool(self._ops._process_post(self.pid, "signal", {"signal": name}).get("signalled"))

    def kill(self) -> ExecutionResult:
        """Stop the command and its process tree (SIGKILL); returns its result, marked ``metadata.killed``."""
        if not self._done.is_set():
            self._f.out.killed = True
            self._ops._process_post(self.pid, "signal", {"signal": "SIGKILL"})
            self._done.wait()
        return self._f.out.finish()


class AsyncProcessHandle(AsyncCommandHandle):
    """The asyncio twin of ProcessHandle: an asyncio task of the caller's loop long-polls the output."""

    def __init__(self, ops: _AsyncProcessOps, pid: int, on_output: OutputCallback | None) -> None:
        # not AsyncCommandHandle.__init__: there is no held run to consume
        self._ops = ops
        self._f = _Follow(pid, on_output)
        self._out = self._f.out  # what the inherited stdout, stderr, exit_code and wait() read
        self._task = asyncio.ensure_future(self._work())

    async def _work(self) -> None:
        while True:
            try:
                got = await self._ops._process_read(self.pid, *self._f.offsets, POLL_WAIT)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - handed to wait() once retries are spent
                if self._f.failed(e):
                    return
                await asyncio.sleep(0.5 * self._f.failures)
                continue
            if self._f.take(got):
                return

    @property
    def pid(self) -> int:
        return self._f.pid

    async def send_stdin(self, data: str | bytes) -> None:
        await self._ops._process_post(self.pid, "stdin", _stdin_body(data))

    async def close_stdin(self) -> None:
        await self._ops._process_post(self.pid, "stdin", {"close": True})

    async def signal(self, name: str = "SIGTERM") -> bool:
        return bool((await self._ops._process_post(self.pid, "signal", {"signal": name})).get("signalled"))

    async def kill(self) -> ExecutionResult:
        if not self._task.done():
            self._f.out.killed = True
            await self._ops._process_post(self.pid, "signal", {"signal": "SIGKILL"})
            await asyncio.wait({self._task})
        return self._f.out.finish()


def _stdin_body(data: str | bytes) -> dict[str, Any]:
    if isinstance(data, bytes):
        return {"data_b64": base64.b64encode(data).decode()}
    return {"data": data}


def started_pid(r: Reply, stdin: bool) -> int | None:
    """The pid a ``POST .../processes`` answered, or None when the service has no background
    processes and the command may run as a held run instead (not one that needs stdin)."""
    if r.status >= 300:
        err = reply_error(r)
        if falls_back(err) and not stdin:
            return None
        raise err
    out = r.obj()
    return decode("a started process", lambda: int(out["pid"]))


def falls_back(e: SandboxError) -> bool:
    """Whether a start refused by the service means "no background processes here": the provider
    has none (501), or the service predates the routes (404/405 on POST, which creates sessions)."""
    details = e.details if isinstance(e.details, dict) else {}
    return details.get("reason") == "background_processes_unsupported" or (
        e.http_status in (404, 405) and "pid" not in details and details.get("reason") != "not_created")
