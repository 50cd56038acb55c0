"""envd's HTTP file routes: GET /files (download bytes), POST /files (multipart or octet-stream).

Both go through the session's provider (read_bytes / write_file / write_files), as the gateway's
/read_binary and /copy do; size limits are the service's max_file_bytes (413 beyond).
"""

from __future__ import annotations

import posixpath
import zlib
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import SandboxError
from .registry import E2BSandbox
from .sandbox_http import TooLarge, envd_error, read_capped
from .workspace import PathRefused, to_e2b, to_workspace

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

def sandbox_error(e: SandboxError) -> Response:
    status = e.http_status if 400 <= e.http_status < 600 else 500
    return envd_error(status, f"{e.code}: {e.message}")


def _gunzip(data: bytes, limit: int) -> bytes:
    """Inflate at most ``limit`` bytes: a small bomb never becomes a large allocation."""
    d = zlib.decompressobj(wbits=31)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise TooLarge("inflated body over the limit")
    return out + d.flush()


class EnvdFiles:
    def __init__(self, services: Services) -> None:
        self.svc = services

    async def __call__(self, sb: E2BSandbox, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/health":
            return Response(status_code=204)
        if path != "/files":
            return envd_error(404, f"no route {method} {path} on envd")
        try:
            if method == "GET":
                return await self.download(sb, request)
            if method == "POST":
                return await self.upload(sb, request)
        except PathRefused as e:
            return envd_error(400, str(e))
        except SandboxError as e:
            return sandbox_error(e)
        return envd_error(405, f"{method} /files is not supported")

    async def download(self, sb: E2BSandbox, request: Request) -> Response:
        rel = to_workspace(request.query_params.get("path") or "")

        def read() -> bytes:
            return self.svc.runs.file_op(sb.tenant_id, sb.session_id, "read_bytes", rel, sb.token_id,
                                           lambda p, i: p.read_bytes(i, rel))

        data = await anyio.to_thread.run_sync(read)
        return Response(data, media_type="application/octet-stream")

    async def upload(self, sb: E2BSandbox, request: Request) -> Response:
        limit = self.svc.settings.max_file_bytes
        files: dict[str, bytes] = {}
        ctype = request.headers.get("content-type", "")
        target = request.query_params.get("path")
        if ctype.startswith("multipart/form-data"):
            form = await request.form(max_files=1000, max_fields=1000, max_part_size=limit)
            items = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
            if not items:
                return envd_error(400, "the multipart body holds no file")
            for item in items:
                name = target if (target and len(items) == 1) else item.filename
                data = await item.read()
                if len(data) > limit:
                    return envd_error(413, f"file is larger than the limit of {limit} bytes")
                files[to_workspace(name or "")] = data
        else:
            if not target:
                return envd_error(400, "path is required for an octet-stream upload")
            try:
                data = await read_capped(request, limit)
                if request.headers.get("content-encoding") == "gzip":
                    data = _gunzip(data, limit)
            except TooLarge:
                return envd_error(413, f"file is larger than the limit of {limit} bytes")
            except zlib.error as e:
                return envd_error(400, f"gzip body is corrupt: {e}")
            files[to_workspace(target)] = data

        def put(prov: Any, instance_id: str) -> None:
            if len(files) == 1:
                (p, d), = files.items()
                prov.write_file(instance_id, p, d, "overwrite")
            else:
                prov.write_files(instance_id, dict(files))

        def write() -> None:
            op = "write_file" if len(files) == 1 else "write_files"
            self.svc.runs.file_op(sb.tenant_id, sb.session_id, op, ",".join(files), sb.token_id, put)

        await anyio.to_thread.run_sync(write)
        return JSONResponse([{"name": posixpath.basename(p), "type": "file", "path": to_e2b(p)} for p in files])
