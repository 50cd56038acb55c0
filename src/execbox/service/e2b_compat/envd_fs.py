"""envd's filesystem service (Connect RPC, filesystem.Filesystem) over the session's file ops.

Stat and ListDir use ``list_files``; MakeDir, Move and Remove use the agent's file operations
(``make_dir``, ``move_path``, ``delete_path`` on agent-backed providers; others answer
UNIMPLEMENTED). WatchDir polls ``list_files`` and reports create/write/remove differences: it
sees changes made through any path (code, commands, uploads), at a 200 ms granularity.
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import Any

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ...errors import SandboxError
from ...models import FileInfo
from .envd_gen.filesystem import filesystem_pb as pb
from .envd_process import connect_error, sandbox_for
from .registry import E2BSandbox, Registry
from .workspace import PathRefused, to_e2b, to_workspace

WATCH_POLL_SECONDS = 0.2


def _entry(info: FileInfo) -> pb.EntryInfo:
    secs = int(info.modified)
    return pb.EntryInfo(
        name=posixpath.basename(info.path) or "user", path=to_e2b(info.path), size=info.size,
        type=pb.FileType.DIRECTORY if info.is_dir else pb.FileType.FILE,
        mode=0o755 if info.is_dir else 0o644, permissions="drwxr-xr-x" if info.is_dir else "-rw-r--r--",
        owner="user", group="user",
        modified_time=Timestamp(seconds=secs, nanos=int((info.modified - secs) * 1e9)))


def _rel(path: str) -> str:
    try:
        return to_workspace(path)
    except PathRefused as e:
        raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None


class FilesystemService:
    def __init__(self, app_state: Any) -> None:
        self.state = app_state

    @property
    def reg(self) -> Registry:
        return self.state.e2b

    async def _call(self, sb: E2BSandbox, op: str, *args: Any) -> Any:
        def go() -> Any:
            with self.state.sessions.session(sb.tenant_id, sb.session_id) as s:
                fn = getattr(s.provider, op, None)
                if fn is None:
                    raise ConnectError(Code.UNIMPLEMENTED, f"provider {s.provider.name!r} has no {op}")
                return fn(s.instance_id, *args)

        try:
            return await anyio.to_thread.run_sync(go)
        except SandboxError as e:
            raise connect_error(e) from None

    async def _stat(self, sb: E2BSandbox, rel: str) -> FileInfo:
        if rel == ".":
            return FileInfo(".", 0, True, 0.0)
        parent = posixpath.dirname(rel) or "."
        for info in await self._call(sb, "list_files", parent, False):
            if posixpath.normpath(info.path) == rel:
                return info
        raise ConnectError(Code.NOT_FOUND, f"{to_e2b(rel)} does not exist")

    async def stat(self, request: pb.StatRequest, ctx: Any) -> pb.StatResponse:
        sb = sandbox_for(self.reg, ctx)
        return pb.StatResponse(entry=_entry(await self._stat(sb, _rel(request.path))))

    async def list_dir(self, request: pb.ListDirRequest, ctx: Any) -> pb.ListDirResponse:
        sb = sandbox_for(self.reg, ctx)
        rel = _rel(request.path)
        depth = request.depth or 1
        infos = await self._call(sb, "list_files", rel, depth > 1)
        base = 0 if rel == "." else rel.count("/") + 1
        entries = [_entry(i) for i in infos if i.path.count("/") + 1 - base <= depth]
        return pb.ListDirResponse(entries=entries)

    async def make_dir(self, request: pb.MakeDirRequest, ctx: Any) -> pb.MakeDirResponse:
        sb = sandbox_for(self.reg, ctx)
        rel = _rel(request.path)
        created = await self._call(sb, "make_dir", rel)
        if not created:
            raise ConnectError(Code.ALREADY_EXISTS, f"{request.path} already exists")
        return pb.MakeDirResponse(entry=_entry(await self._stat(sb, rel)))

    async def move(self, request: pb.MoveRequest, ctx: Any) -> pb.MoveResponse:
        sb = sandbox_for(self.reg, ctx)
        dest = _rel(request.destination)
        await self._call(sb, "move_path", _rel(request.source), dest)
        return pb.MoveResponse(entry=_entry(await self._stat(sb, dest)))

    async def remove(self, request: pb.RemoveRequest, ctx: Any) -> pb.RemoveResponse:
        sb = sandbox_for(self.reg, ctx)
        await self._call(sb, "delete_path", _rel(request.path))
        return pb.RemoveResponse()

    async def _snapshot(self, sb: E2BSandbox, rel: str, recursive: bool) -> dict[str, tuple[int, float]]:
        return {i.path: (i.size, i.modified) for i in await self._call(sb, "list_files", rel, recursive)}

    async def watch_dir(self, request: pb.WatchDirRequest, ctx: Any):  # noqa: ANN201
        sb = sandbox_for(self.reg, ctx)
        rel = _rel(request.path)
        info = await self._stat(sb, rel)
        if not info.is_dir:
            raise ConnectError(Code.INVALID_ARGUMENT, f"{request.path} is not a directory")
        before = await self._snapshot(sb, rel, request.recursive)
        yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
        while self.reg.get(sb.sandbox_id) is sb:
            await asyncio.sleep(WATCH_POLL_SECONDS)
            try:
                now = await self._snapshot(sb, rel, request.recursive)
            except ConnectError:
                return
            for path in sorted(now.keys() | before.keys()):
                kind = (pb.EventType.CREATE if path not in before else
                        pb.EventType.REMOVE if path not in now else
                        pb.EventType.WRITE if now[path] != before[path] else None)
                if kind is None:
                    continue
                name = path if rel == "." else posixpath.relpath(path, rel)
                yield pb.WatchDirResponse(event=Oneof("filesystem", pb.FilesystemEvent(name=name, type=kind)))
            before = now

    async def create_watcher(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "polling watchers are not supported by execbox yet; use WatchDir")

    async def get_watcher_events(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "polling watchers are not supported by execbox yet; use WatchDir")

    async def remove_watcher(self, request: Any, ctx: Any) -> Any:
        raise ConnectError(Code.UNIMPLEMENTED, "polling watchers are not supported by execbox yet; use WatchDir")
