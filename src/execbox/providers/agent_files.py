"""Workspace file operations of agent-backed providers: each one is a single request to the agent.

The agent (agent/fileops.py, agent/search.py) validates every path and does the I/O; this side
only encodes arguments and maps results to models, keeping everything the agent reports (a
grep's ``truncated``, ``binary_matches`` and ``skipped``, a glob's ``truncated``, a read's
``total_size``).
"""

from __future__ import annotations

import base64
from typing import Any

from ..errors import InvalidConfigError
from ..models import FileBytes, FileInfo, GlobResult, GrepResult, TextPage


def workspace_change(provider: Any, method: str, what: str) -> Any:
    """``provider``'s ``delete_path``, ``make_dir`` or ``move_path``: only agent-backed providers
    have them (501 naming the provider otherwise: E2B, AgentRun, RAGFlow's /run)."""
    fn = getattr(provider, method, None)
    if fn is None:
        raise InvalidConfigError(
            f"provider {provider.name!r} cannot {what}; the self-hosted providers (jail, docker, kubernetes, "
            "local) can", http_status=501, details={"provider": provider.name, "reason": "unsupported"})
    return fn


class AgentFilesMixin:
    """Needs ``_get(instance_id)`` and ``_call(inst, op, params)`` from AgentBackedProvider."""

    _get: Any
    _call: Any

    def read_file(self, instance_id: str, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        v = self._call(self._get(instance_id), "files.read", {"path": path, "offset": offset, "limit": limit})
        return TextPage(**v)

    def read_bytes(self, instance_id: str, path: str, offset: int | None = None,
                   length: int | None = None) -> FileBytes:
        params: dict[str, Any] = {"path": path}
        if offset is not None:
            params["offset"] = offset
        if length is not None:
            params["length"] = length
        v = self._call(self._get(instance_id), "files.read_bytes", params)
        data = base64.b64decode(v["content_b64"])
        start = int(v.get("offset") or 0)
        return FileBytes(data, start, int(v.get("total_size", start + len(data))))

    def write_file(self, instance_id: str, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        v = self._call(self._get(instance_id), "files.write", {"path": path, "mode": mode, **_content(content)})
        return FileInfo(**v)

    def write_files(self, instance_id: str, files: dict[str, str | bytes]) -> list[FileInfo]:
        items = [{"path": p, **_content(c)} for p, c in files.items()]
        v = self._call(self._get(instance_id), "files.write_many", {"files": items})
        return [FileInfo(**f) for f in v["files"]]

    def list_files(self, instance_id: str, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        v = self._call(self._get(instance_id), "files.list", {"path": path, "recursive": recursive})
        return [FileInfo(**f) for f in v["files"]]

    def delete_path(self, instance_id: str, path: str) -> None:
        """Remove a file or a directory tree (the E2B facade's files.remove)."""
        self._call(self._get(instance_id), "files.delete", {"path": path})

    def make_dir(self, instance_id: str, path: str) -> bool:
        """Create a directory and its parents; False when it already existed."""
        return bool(self._call(self._get(instance_id), "files.mkdir", {"path": path})["created"])

    def move_path(self, instance_id: str, source: str, destination: str) -> str:
        return self._call(self._get(instance_id), "files.move",
                          {"source": source, "destination": destination})["path"]

    def glob(self, instance_id: str, pattern: str, max_results: int = 1000) -> GlobResult:
        return GlobResult.from_dict(self._call(self._get(instance_id), "files.glob",
                                               {"pattern": pattern, "max_results": max_results}))

    def grep(self, instance_id: str, pattern: str, path: str = ".", glob: str | None = None,
             max_results: int = 100) -> GrepResult:
        return GrepResult.from_dict(self._call(self._get(instance_id), "files.grep",
                                               {"pattern": pattern, "path": path, "glob": glob,
                                                "max_results": max_results}))



def _content(content: str | bytes) -> dict[str, str]:
    if isinstance(content, bytes):
        return {"content_b64": base64.b64encode(content).decode()}
    if isinstance(content, str):
        return {"content": content}
    raise InvalidConfigError("content must be str or bytes", details={"field": "content"})
