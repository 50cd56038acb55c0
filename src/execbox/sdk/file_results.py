"""What the SDK's ``files`` namespaces (local, remote, sync and async) share: the SDK's own wording
of a binary file's text read, and the HTTP API's file replies decoded into models."""

from __future__ import annotations

import base64
from typing import Any

from ..errors import NotTextError
from ..models import FileBytes


def read_bytes_hint(e: NotTextError, path: str) -> NotTextError:
    """The error of ``files.read()`` of a binary file, naming the SDK method that reads it."""
    return NotTextError(f"{path!r} looks binary (a NUL byte in its first 8 KiB), not text: read it with "
                        f"files.read_bytes({path!r})", details=e.details, http_status=e.http_status)


def range_fields(offset: int | None, length: int | None) -> dict[str, int]:
    """``read_binary``'s byte-range fields, sent only when asked (an older server knows none)."""
    out: dict[str, int] = {}
    if offset is not None:
        out["offset"] = offset
    if length is not None:
        out["length"] = length
    return out


def file_bytes(out: dict[str, Any]) -> FileBytes:
    """A ``read_binary`` reply: the bytes, where they start, the file's whole size (an older server
    sends neither: the whole file)."""
    data = base64.b64decode(out["content_b64"], validate=True)
    start = int(out.get("offset") or 0)
    total = out.get("total_size")
    return FileBytes(data, start, start + len(data) if total is None else int(total))
