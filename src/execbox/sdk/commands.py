"""The ``commands`` namespace every sandbox shares, and the handle of a background command.

A sandbox only has to offer ``run_command(command, timeout=, cwd=, env=, on_output=)`` and a way
to stop the run in progress; this module turns that into ``sb.commands.run(cmd)`` (foreground:
the ExecutionResult) and ``sb.commands.run(cmd, background=True)`` (a handle with live
``stdout``/``stderr``, ``wait()``, ``kill()`` and ``exit_code``). Execution itself stays in the
in-box agent: a background command is the same run, consumed on a thread (or an asyncio task).
A remote sandbox's background command is instead one of the service's background processes
(``process_handles``), which does not hold the session.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import ExecutionTimeoutError, InvalidConfigError
from ..models import ExecutionResult
from ..providers.base import OutputCallback
from ..providers.output_cap import cap_text

KILLED_EXIT_CODE = -9
"""exit_code of a command stopped by ``kill()`` when the backend reports no result of its own."""


RunFn = Callable[[OutputCallback], ExecutionResult]
StopFn = Callable[[], None]


class _Runs(Protocol):
    def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None
                    ) -> ExecutionResult: ...

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[RunFn, StopFn]:
        """How to run this command with an output callback, and how to stop that one run."""
        ...


class _Output:
    """stdout/stderr as they arrive, then the final result.

    ``cap``: UTF-8 bytes kept of each stream (its head, as a held run keeps), ``truncated`` once
    more came; None keeps all (a held run's output is capped in its box already). The user's
    callback gets every chunk either way."""

    def __init__(self, user: OutputCallback | None, cap: int | None = None) -> None:
        self._user = user
        self._out: list[str] = []
        self._err: list[str] = []
        self._cap = cap
        self._kept = {"stdout": 0, "stderr": 0}
        self.truncated = False
        self._lock = threading.Lock()
        self.result: ExecutionResult | None = None
        self.error: BaseException | None = None
        self.killed = False

    def __call__(self, stream: str, text: str) -> None:
        with self._lock:
            self._keep(stream, text)
        if self._user is not None:
            self._user(stream, text)

    def _keep(self, stream: str, text: str) -> None:
        """Call with the lock held."""
        stream = "stdout" if stream == "stdout" else "stderr"
        if self._cap is not None:
            room = self._cap - self._kept[stream]
            if room <= 0:  # full: nothing more is kept (the common case of a chatty process)
                self.truncated = self.truncated or bool(text)
                return
            text, cut = cap_text(text, room)
            self.truncated = self.truncated or cut
            self._kept[stream] += len(text.encode("utf-8", "surrogatepass"))
        (self._out if stream == "stdout" else self._err).append(text)

    @property
    def stdout(self) -> str:
        if self.result is not None:
            return self.result.stdout
        with self._lock:
            return "".join(self._out)

    @property
    def stderr(self) -> str:
        if self.result is not None:
            return self.result.stderr
        with self._lock:
            return "".join(self._err)

    def finish(self) -> ExecutionResult:
        if self.result is not None:
            if self.killed:
                self.result.metadata["killed"] = True
            return self.result
        if self.killed:  # the run was cut off before a result came back (e.g. a dropped stream)
            self.result = ExecutionResult(self.stdout, self.stderr, KILLED_EXIT_CODE, 0.0,
                                          truncated=self.truncated, metadata={"killed": True})
            return self.result
        assert self.error is not None
        raise self.error


class CommandHandle:
    """A command running in the background of a sandbox (``commands.run(..., background=True)``).

    ``stdout``/``stderr`` grow while it runs; ``wait()`` returns its ExecutionResult (raising
    what a foreground run would raise); ``kill()`` stops it and its process tree. While it runs,
    other calls on the same sandbox wait for the box, as they would behind a foreground run.
    """

    def __init__(self, run: RunFn, stop: StopFn, on_output: OutputCallback | None) -> None:
        self._stop = stop
        self._out = _Output(on_output)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(run,), name="execbox-command", daemon=True)
        self._thread.start()

    def _work(self, run: RunFn) -> None:
        try:
            self._out.result = run(self._out)
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._out.error = e
        finally:
            self._done.set()

    @property
    def stdout(self) -> str:
        return self._out.stdout

    @property
    def stderr(self) -> str:
        return self._out.stderr

    @property
    def truncated(self) -> bool:
        """Whether output was left out of ``stdout``/``stderr`` (the cap; ``on_output`` got it all)."""
        result = self._out.result
        return result.truncated if result is not None else self._out.truncated

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    @property
    def exit_code(self) -> int | None:
        """None while running; the exit code once finished (``KILLED_EXIT_CODE`` when cut off)."""
        if not self._done.is_set():
            return None
        try:
            return self._out.finish().exit_code
        except BaseException:  # noqa: BLE001 - the error is wait()'s to raise
            return None

    def wait(self, timeout: float | None = None) -> ExecutionResult:
        """The command's result; SB005 ExecutionTimeoutError if it is still running after ``timeout``."""
        if not self._done.wait(timeout):
            raise ExecutionTimeoutError(f"the command is still running after {timeout} s (it keeps running; "
                                        "kill() stops it)", details={"waited": timeout})
        return self._out.finish()

    def kill(self) -> ExecutionResult:
        """Stop the command (and what it started); returns its result, marked ``metadata.killed``."""
        if not self._done.is_set():
            self._out.killed = True
            self._stop()
            while not self._done.wait(0.2):  # the stop may land before the run reached its box: repeat
                self._stop()
        return self._out.finish()


class Commands:
    """``sb.commands``: shell commands in the sandbox's workspace, foreground or background."""

    def __init__(self, sandbox: _Runs) -> None:
        self._sb = sandbox

    def run(self, command: str, *, background: bool = False, timeout: float | None = None,
            cwd: str | None = None, env: dict[str, str] | None = None,
            on_output: OutputCallback | None = None, stdin: bool = False) -> Any:
        """The ExecutionResult; with ``background=True`` a handle at once: on a RemoteSandbox a
        ProcessHandle (a background process of the session, which goes on beside other calls;
        ``stdin=True`` keeps its stdin open for ``send_stdin``), else a CommandHandle."""
        if background:
            start = getattr(self._sb, "_start_process", None)
            handle = start(command, timeout, cwd, env, on_output, stdin) if start is not None else None
            if handle is not None:
                return handle
            _no_stdin(stdin)
            return CommandHandle(*self._sb._command_parts(command, timeout, cwd, env), on_output)
        _no_stdin(stdin)
        return self._sb.run_command(command, timeout=timeout, cwd=cwd, env=env, on_output=on_output)


def _no_stdin(stdin: bool) -> None:
    if stdin:
        raise InvalidConfigError("stdin=True needs a background command on a service session (RemoteSandbox "
                                 "on a provider with background processes)", details={"field": "stdin"})


AsyncRunFn = Callable[[OutputCallback], Awaitable[ExecutionResult]]
AsyncStopFn = Callable[[], Awaitable[None]] | None
"""None: stopping means cancelling the run's task (a remote stream that closes cancels the run)."""


class _AsyncRuns(Protocol):
    async def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                          env: dict[str, str] | None = None, on_output: OutputCallback | None = None
                          ) -> ExecutionResult: ...

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[AsyncRunFn, AsyncStopFn]: ...


class AsyncCommandHandle:
    """The asyncio twin of CommandHandle: the run is an asyncio task of the caller's loop."""

    def __init__(self, run: AsyncRunFn, stop: AsyncStopFn, on_output: OutputCallback | None) -> None:
        self._stop = stop
        self._out = _Output(on_output)
        self._task = asyncio.ensure_future(self._work(run))

    async def _work(self, run: AsyncRunFn) -> None:
        try:
            self._out.result = await run(self._out)
        except asyncio.CancelledError:
            if not self._out.killed:
                raise
        except Exception as e:  # noqa: BLE001 - handed to wait()
            self._out.error = e

    @property
    def stdout(self) -> str:
        return self._out.stdout

    @property
    def stderr(self) -> str:
        return self._out.stderr

    @property
    def truncated(self) -> bool:
        """Whether output was left out of ``stdout``/``stderr`` (the cap; ``on_output`` got it all)."""
        result = self._out.result
        return result.truncated if result is not None else self._out.truncated

    @property
    def running(self) -> bool:
        return not self._task.done()

    @property
    def exit_code(self) -> int | None:
        if not self._task.done():
            return None
        try:
            return self._out.finish().exit_code
        except BaseException:  # noqa: BLE001
            return None

    async def wait(self, timeout: float | None = None) -> ExecutionResult:
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        if not done:
            raise ExecutionTimeoutError(f"the command is still running after {timeout} s (it keeps running; "
                                        "kill() stops it)", details={"waited": timeout})
        return self._out.finish()

    async def kill(self) -> ExecutionResult:
        if not self._task.done() and self._stop is None:
            self._out.killed = True
            self._task.cancel()
            await asyncio.wait({self._task})
        if not self._task.done():
            assert self._stop is not None
            self._out.killed = True
            await self._stop()
            while not self._task.done():
                done, _ = await asyncio.wait({self._task}, timeout=0.2)
                if not done:
                    await self._stop()
        return self._out.finish()


class AsyncCommands:
    """``sb.commands`` of the async sandboxes."""

    def __init__(self, sandbox: _AsyncRuns) -> None:
        self._sb = sandbox

    async def run(self, command: str, *, background: bool = False, timeout: float | None = None,
                  cwd: str | None = None, env: dict[str, str] | None = None,
                  on_output: OutputCallback | None = None, stdin: bool = False) -> Any:
        """The ExecutionResult; with ``background=True`` a handle once the command is started: on an
        AsyncRemoteSandbox an AsyncProcessHandle (see Commands.run), else an AsyncCommandHandle."""
        if not background:
            _no_stdin(stdin)
            return await self._sb.run_command(command, timeout=timeout, cwd=cwd, env=env, on_output=on_output)
        start = getattr(self._sb, "_start_process", None)
        if start is not None:
            started = await start(command, timeout, cwd, env, on_output, stdin)
            if started is not None:
                return started
        _no_stdin(stdin)
        handle = AsyncCommandHandle(*self._sb._command_parts(command, timeout, cwd, env), on_output)
        await asyncio.sleep(0)  # let the task start its request
        return handle
