"""AsyncSandbox: the asyncio twin of the in-process ``Sandbox`` (same namespaces, awaited).

Providers are synchronous (they talk to a box over a socket or a pipe), so every call runs on a
worker thread; output callbacks are called from that thread, as with the sync Sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from ..models import ExecutionResult, FileInfo, GrepMatch, TextPage
from ..providers.base import OutputCallback, SandboxProvider
from .commands import AsyncCommands, AsyncRunFn, AsyncStopFn
from .local import Sandbox

T = TypeVar("T")


def _thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    return asyncio.to_thread(fn, *args, **kwargs)


class AsyncFiles:
    """Workspace file operations of one AsyncSandbox (paths relative to the workspace)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._files = sandbox.files

    async def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        return await _thread(self._files.read, path, offset, limit)

    async def read_bytes(self, path: str, offset: int | None = None, length: int | None = None) -> bytes:
        return await _thread(self._files.read_bytes, path, offset, length)

    async def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        return await _thread(self._files.write, path, content, mode)

    async def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        return await _thread(self._files.write_many, files)

    async def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        return await _thread(self._files.list, path, recursive)

    async def glob(self, pattern: str, max_results: int = 1000) -> list[str]:
        return await _thread(self._files.glob, pattern, max_results)

    async def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
                   ) -> list[GrepMatch]:
        return await _thread(self._files.grep, pattern, path, glob, max_results)

    async def delete(self, path: str) -> None:
        await _thread(self._files.delete, path)

    async def mkdir(self, path: str) -> bool:
        return await _thread(self._files.mkdir, path)

    async def move(self, source: str, destination: str) -> str:
        return await _thread(self._files.move, source, destination)


class AsyncSandbox:
    """An in-process session, awaited: ``async with await AsyncSandbox.create("jail") as sb: ...``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.files = AsyncFiles(sandbox)
        self.commands = AsyncCommands(self)

    @classmethod
    async def create(cls, provider: str | SandboxProvider | None = None, *,
                     config: Mapping[str, Any] | None = None, tenant_id: str = "default",
                     session_id: str | None = None, template: str = "python") -> AsyncSandbox:
        sb = await _thread(Sandbox.create, provider, config=config, tenant_id=tenant_id,
                           session_id=session_id, template=template)
        return cls(sb)

    @property
    def provider(self) -> SandboxProvider:
        return self.sync.provider

    @property
    def instance_id(self) -> str:
        return self.sync.instance_id

    @property
    def closed(self) -> bool:
        return self.sync.closed

    async def run_code(self, code: str, language: str = "python", *, timeout: float | None = None,
                       arguments: dict[str, Any] | None = None, context_id: str | None = None,
                       on_output: OutputCallback | None = None) -> ExecutionResult:
        return await _thread(self.sync.run_code, code, language, timeout=timeout, arguments=arguments,
                             context_id=context_id, on_output=on_output)

    async def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                          env: dict[str, str] | None = None, on_output: OutputCallback | None = None
                          ) -> ExecutionResult:
        return await _thread(self.sync.run_command, command, timeout=timeout, cwd=cwd, env=env,
                             on_output=on_output)

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[AsyncRunFn, AsyncStopFn]:
        run, stop = self.sync._command_parts(command, timeout, cwd, env)

        async def arun(out: OutputCallback) -> ExecutionResult:
            return await _thread(run, out)

        async def astop() -> None:
            await _thread(stop)

        return arun, astop

    async def close(self) -> None:
        await _thread(self.sync.close)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
