"""envd's filesystem service (Connect RPC, filesystem.Filesystem) over the session's file ops.

Stat and ListDir use ``list_files``; MakeDir, Move and Remove use the agent's file operations
(``make_dir``, ``move_path``, ``delete_path`` on agent-backed providers; others answer
UNIMPLEMENTED). WatchDir (streamed, polling every 200 ms) and the polling watchers the sync SDK uses
(CreateWatcher / GetWatcherEvents / RemoveWatcher) diff ``list_files`` snapshots into
create/write/remove events: they see changes made through any path (code, commands, uploads).
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from .sandbox_http import clip
from .workspace import PathRefused, to_e2b, to_workspace

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

WATCH_POLL_SECONDS = 0.2
MAX_WATCHERS = 64


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
    def __init__(self, services: Services) -> None:
        self.svc = services

    @property
    def reg(self) -> Registry:
        return self.svc.e2b

    async def _call(self, sb: E2BSandbox, op: str, *args: Any) -> Any:
        def call(provider: Any, instance_id: str) -> Any:
            fn = getattr(provider, op, None)
            if fn is None:
                raise ConnectError(Code.UNIMPLEMENTED, f"provider {provider.name!r} has no {op}")
            return fn(instance_id, *args)

        def go() -> Any:
            path = str(args[0]) if args else "."
            return self.svc.runs.file_op(sb.tenant_id, sb.session_id, op, path, sb.token_id, call)

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

    @staticmethod
    def _diff(before: dict[str, tuple[int, float]], now: dict[str, tuple[int, float]],
              rel: str) -> list[pb.FilesystemEvent]:
        events = []
        for path in sorted(now.keys() | before.keys()):
            kind = (pb.EventType.CREATE if path not in before else
                    pb.EventType.REMOVE if path not in now else
                    pb.EventType.WRITE if now[path] != before[path] else None)
            if kind is not None:
                name = path if rel == "." else posixpath.relpath(path, rel)
                events.append(pb.FilesystemEvent(name=name, type=kind))
        return events

    async def _watched(self, sb: E2BSandbox, path: str) -> str:
        rel = _rel(path)
        if not (await self._stat(sb, rel)).is_dir:
            raise ConnectError(Code.INVALID_ARGUMENT, f"{path} is not a directory")
        return rel

    async def watch_dir(self, request: pb.WatchDirRequest, ctx: Any):  # noqa: ANN201
        sb = sandbox_for(self.reg, ctx)
        rel = await self._watched(sb, request.path)
        before = await self._snapshot(sb, rel, request.recursive)
        yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
        while self.reg.get(sb.sandbox_id) is sb:
            await asyncio.sleep(WATCH_POLL_SECONDS)
            try:
                now = await self._snapshot(sb, rel, request.recursive)
            except ConnectError:
                return
            for event in self._diff(before, now, rel):
                yield pb.WatchDirResponse(event=Oneof("filesystem", event))
            before = now

    # -- polling watchers (what the sync SDK's watch_dir uses) -------------------------------
    @staticmethod
    def _watchers(sb: E2BSandbox) -> dict[str, Watcher]:
        found = getattr(sb, "_watchers", None)
        if found is None:
            found = {}
            sb._watchers = found  # type: ignore[attr-defined]
        return found

    async def create_watcher(self, request: pb.CreateWatcherRequest, ctx: Any) -> pb.CreateWatcherResponse:
        sb = sandbox_for(self.reg, ctx)
        watchers = self._watchers(sb)
        if len(watchers) >= MAX_WATCHERS:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, f"a sandbox may hold {MAX_WATCHERS} watchers")
        rel = await self._watched(sb, request.path)
        w = Watcher(rel, request.recursive, await self._snapshot(sb, rel, request.recursive))
        wid = secrets.token_hex(8)
        watchers[wid] = w
        return pb.CreateWatcherResponse(watcher_id=wid)

    async def get_watcher_events(self, request: pb.GetWatcherEventsRequest,
                                 ctx: Any) -> pb.GetWatcherEventsResponse:
        sb = sandbox_for(self.reg, ctx)
        w = self._watchers(sb).get(request.watcher_id)
        if w is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {clip(request.watcher_id)!r} not found")
        now = await self._snapshot(sb, w.rel, w.recursive)
        events, w.snapshot = self._diff(w.snapshot, now, w.rel), now
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(self, request: pb.RemoveWatcherRequest, ctx: Any) -> pb.RemoveWatcherResponse:
        sb = sandbox_for(self.reg, ctx)
        if self._watchers(sb).pop(request.watcher_id, None) is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {clip(request.watcher_id)!r} not found")
        return pb.RemoveWatcherResponse()


@dataclass
class Watcher:
    rel: str
    recursive: bool
    snapshot: dict[str, tuple[int, float]]
