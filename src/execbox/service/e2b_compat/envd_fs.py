"""envd's filesystem service (Connect RPC, filesystem.Filesystem) over the session's file ops.

Stat and ListDir use ``list_files``; MakeDir, Move and Remove use the agent's file operations
(``make_dir``, ``move_path``, ``delete_path`` on agent-backed providers; others answer
UNIMPLEMENTED). WatchDir (streamed) and the watchers the sync SDK uses (CreateWatcher /
GetWatcherEvents / RemoveWatcher) share one poll loop (``_changes``): every 200 ms it lists the
directory straight from the sandbox's box and diffs the listing into create/write/rename/remove
events, so they see changes made through any path (code, commands, uploads). A watcher's loop
runs from CreateWatcher on, in the background, buffering its events until GetWatcherEvents takes
them. The loop never takes the session (a run is never kept waiting) and never starts or resumes
a box: while the sandbox is paused or its box is being replaced it skips its turn.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ...agent.paths import names_directory
from ...errors import FileNotFoundInSandbox, PathError, SandboxError
from ...models import FileInfo
from .envd_gen.filesystem import filesystem_pb as pb
from .envd_process import connect_error, sandbox_for
from .registry import E2BSandbox, Registry
from .sandbox_http import clip
from .workspace import HOME, PathRefused, to_e2b, to_workspace

WORKSPACE_ROOT = "/workspace"  # the workspace inside the box (/home/user links to it)

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

log = logging.getLogger("execbox.service.e2b")

WATCH_POLL_SECONDS = 0.2
MAX_WATCHERS = 16
"""Watchers (CreateWatcher) one sandbox may hold at once: each polls its box every 200 ms."""
MAX_WATCHER_EVENTS = 10_000
"""Events a watcher buffers until GetWatcherEvents takes them; beyond, the oldest are dropped."""

Snapshot = dict[str, tuple[int, float, bool]]
"""path -> (size, mtime, is_dir) of each entry a listing holds."""


def _entry(info: FileInfo) -> pb.EntryInfo:
    secs = int(info.modified)
    stamp = Timestamp(seconds=secs, nanos=int((info.modified - secs) * 1e9))
    name, path = posixpath.basename(info.path) or "user", to_e2b(info.path)
    if info.symlink_target is not None:  # as envd reports a link: its own size, where it points
        return pb.EntryInfo(name=name, path=path, size=info.size, type=pb.FileType.SYMLINK, mode=0o777,
                            permissions="lrwxrwxrwx", owner="user", group="user", modified_time=stamp,
                            symlink_target=link_target(info.path, info.symlink_target))
    return pb.EntryInfo(
        name=name, path=path, size=info.size,
        type=pb.FileType.DIRECTORY if info.is_dir else pb.FileType.FILE,
        mode=0o755 if info.is_dir else 0o644, permissions="drwxr-xr-x" if info.is_dir else "-rw-r--r--",
        owner="user", group="user", modified_time=stamp)


def link_target(rel: str, text: str) -> str:
    """Where a workspace symlink points, as the sandbox names it: a ``/home/user/...`` path when
    the link text leads into the workspace (relative, or by /workspace or /home/user), else the
    text as it is. Worked out from the text alone: nothing is followed."""
    where = posixpath.normpath(posixpath.join(posixpath.dirname(rel) or ".", text)) if not text.startswith("/") \
        else text
    for root in (WORKSPACE_ROOT, HOME):
        if where == root or where.startswith(root + "/"):
            where = posixpath.relpath(posixpath.normpath(where), root)
            break
    if where.startswith("/") or where == ".." or where.startswith("../"):
        return text
    try:
        return to_e2b(where)
    except PathRefused:
        return text


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
        # "m/" must be a directory (rename(2)): the agent decides that from the form, lost by normalising
        asked = dest + "/" if names_directory(request.destination) and dest != "." else dest
        await self._call(sb, "move_path", _rel(request.source), asked)
        return pb.MoveResponse(entry=_entry(await self._stat(sb, dest)))

    async def remove(self, request: pb.RemoveRequest, ctx: Any) -> pb.RemoveResponse:
        sb = sandbox_for(self.reg, ctx)
        await self._call(sb, "delete_path", _rel(request.path))
        return pb.RemoveResponse()

    async def _snapshot(self, sb: E2BSandbox, rel: str, recursive: bool) -> Snapshot:
        return _listing(await self._call(sb, "list_files", rel, recursive))

    async def _look(self, sb: E2BSandbox, rel: str, recursive: bool) -> Snapshot | None:
        """A watch loop's listing: from the box the session runs, without taking the session (a
        run goes on beside it, as background processes are followed); None when there is no
        running box to ask (paused, being replaced, busy). ConnectError once the watched
        directory is gone (or became a path the workspace rules refuse)."""
        s = self.svc.sessions.get(sb.tenant_id, sb.session_id)
        if s is None or s.closed or s.state != "running" or s.provider is None or s.instance_id is None:
            return None
        provider, iid = s.provider, s.instance_id
        if not getattr(provider, "supports_background_processes", False):
            return await self._snapshot(sb, rel, recursive)  # no in-box agent: through the session

        def ask() -> Snapshot | None:
            beside = getattr(provider, "files_beside_runs", None)
            if s.running and not (beside is not None and beside(iid)):
                return None  # the agent would only answer after the run: look again later
            try:
                return _listing(provider.list_files(iid, rel, recursive))
            except (FileNotFoundInSandbox, PathError) as e:
                raise ConnectError(Code.NOT_FOUND, f"{to_e2b(rel)}: {e.message}") from None
            except SandboxError:  # the box went (pause, kill) or is busy: skip this turn
                return None

        return await anyio.to_thread.run_sync(ask)

    async def _changes(self, sb: E2BSandbox, rel: str, recursive: bool,
                       before: Snapshot) -> AsyncIterator[list[pb.FilesystemEvent]]:
        """The poll loop of WatchDir and of watchers: every WATCH_POLL_SECONDS while the sandbox
        lives, the events since the last look (none are yielded empty). Ends with ConnectError
        when the directory goes."""
        while await anyio.to_thread.run_sync(self.reg.get, sb.sandbox_id) is sb:  # may read the store
            await asyncio.sleep(WATCH_POLL_SECONDS)
            now = await self._look(sb, rel, recursive)
            if now is None:
                continue
            events = self._diff(before, now, rel)
            before = now
            if events:
                yield events

    @staticmethod
    def _diff(before: Snapshot, now: Snapshot, rel: str) -> list[pb.FilesystemEvent]:
        """Events from one listing to the next, by path. An entry gone and one new with the same
        size, mtime and kind (a rename keeps them; the match must be unique) are a rename: RENAME
        for the old name then CREATE for the new one, as inotify reports a move. A directory's
        own size/mtime changing (an entry added or removed inside) is no WRITE."""
        gone: dict[tuple[int, float, bool], list[str]] = {}
        new: dict[tuple[int, float, bool], list[str]] = {}
        for path in before.keys() - now.keys():
            gone.setdefault(before[path], []).append(path)
        for path in now.keys() - before.keys():
            new.setdefault(now[path], []).append(path)
        renamed = {olds[0]: new[key][0] for key, olds in gone.items()
                   if len(olds) == 1 and len(new.get(key, ())) == 1}
        targets = set(renamed.values())

        def event(path: str, kind: pb.EventType) -> pb.FilesystemEvent:
            return pb.FilesystemEvent(name=path if rel == "." else posixpath.relpath(path, rel), type=kind)

        events = []
        for path in sorted(now.keys() | before.keys()):
            if path in targets:
                continue  # reported right after its rename
            if path in renamed:
                events += [event(path, pb.EventType.RENAME), event(renamed[path], pb.EventType.CREATE)]
            elif path not in before:
                events.append(event(path, pb.EventType.CREATE))
            elif path not in now:
                events.append(event(path, pb.EventType.REMOVE))
            elif now[path] != before[path] and not now[path][2]:
                events.append(event(path, pb.EventType.WRITE))
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
        try:
            async for events in self._changes(sb, rel, request.recursive, before):
                for event in events:
                    yield pb.WatchDirResponse(event=Oneof("filesystem", event))
        except ConnectError:
            return  # the directory went: the stream ends

    # -- watchers (what the sync SDK's watch_dir uses) ---------------------------------------
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
            raise ConnectError(Code.RESOURCE_EXHAUSTED, f"a sandbox may hold {MAX_WATCHERS} watchers; "
                                                        "remove one (stop its watch handle) first")
        rel = await self._watched(sb, request.path)
        before = await self._snapshot(sb, rel, request.recursive)
        if len(watchers) >= MAX_WATCHERS:  # others were made while this one listed
            raise ConnectError(Code.RESOURCE_EXHAUSTED, f"a sandbox may hold {MAX_WATCHERS} watchers")
        wid = secrets.token_hex(8)
        w = Watcher(rel, request.recursive)
        watchers[wid] = w
        w.task = asyncio.get_running_loop().create_task(self._record(sb, wid, w, before),
                                                        name=f"execbox-e2b-watcher-{wid}")
        return pb.CreateWatcherResponse(watcher_id=wid)

    async def _record(self, sb: E2BSandbox, wid: str, w: Watcher, before: Snapshot) -> None:
        """A watcher's background loop: buffer every event from its creation on; once the
        sandbox ends, forget the watcher."""
        try:
            async for events in self._changes(sb, w.rel, w.recursive, before):
                w.add(events)
        except ConnectError:
            pass  # the directory went: what was recorded stays to be read
        except Exception:  # noqa: BLE001 - a watcher must not take the server down
            log.exception("watcher %s of e2b sandbox %s failed", wid, sb.sandbox_id)
        finally:
            if await anyio.to_thread.run_sync(self.reg.get, sb.sandbox_id) is not sb:
                self._watchers(sb).pop(wid, None)

    async def get_watcher_events(self, request: pb.GetWatcherEventsRequest,
                                 ctx: Any) -> pb.GetWatcherEventsResponse:
        sb = sandbox_for(self.reg, ctx)
        w = self._watchers(sb).get(request.watcher_id)
        if w is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {clip(request.watcher_id)!r} not found")
        return pb.GetWatcherEventsResponse(events=w.take())

    async def remove_watcher(self, request: pb.RemoveWatcherRequest, ctx: Any) -> pb.RemoveWatcherResponse:
        sb = sandbox_for(self.reg, ctx)
        w = self._watchers(sb).pop(request.watcher_id, None)
        if w is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {clip(request.watcher_id)!r} not found")
        if w.task is not None:
            w.task.cancel()
        return pb.RemoveWatcherResponse()


def _listing(infos: list[FileInfo]) -> Snapshot:
    return {i.path: (i.size, i.modified, i.is_dir) for i in infos}


@dataclass
class Watcher:
    rel: str
    recursive: bool
    events: deque[pb.FilesystemEvent] = field(default_factory=lambda: deque(maxlen=MAX_WATCHER_EVENTS))
    dropped: int = 0
    """Events lost to the MAX_WATCHER_EVENTS cap since the last GetWatcherEvents."""
    task: asyncio.Task[None] | None = None

    def add(self, events: list[pb.FilesystemEvent]) -> None:
        self.dropped += max(0, len(self.events) + len(events) - MAX_WATCHER_EVENTS)
        self.events.extend(events)

    def take(self) -> list[pb.FilesystemEvent]:
        """The buffered events, oldest first; the buffer is empty after."""
        events = list(self.events)
        self.events.clear()
        if self.dropped:
            log.info("an e2b watcher dropped %d events over its cap of %d", self.dropped, MAX_WATCHER_EVENTS)
            self.dropped = 0
        return events
