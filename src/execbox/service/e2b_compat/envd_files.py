"""envd's HTTP file routes: GET /files (download bytes), POST /files (multipart or octet-stream).

Both go through the session's provider (read_bytes / write_file / write_files), as the gateway's
/read_binary and /copy do. A download has no size limit (a large file is streamed a byte range at a
time); an upload's is the service's max_file_bytes (413 beyond).
"""

from __future__ import annotations

import posixpath
import zlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...errors import PayloadTooLargeError, SandboxError
from ..errors import BodyTooLarge
from .registry import E2BSandbox
from .sandbox_http import TooLarge, clip, envd_error, read_capped
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


READ_PIECE = 16 * 1024 * 1024
"""A download larger than this is read from the box a range of this many bytes at a time (one
read holds at most 64 MiB: agent/fileops.MAX_READ_BYTES)."""
MAX_PARTS = 1000
BATCH_BYTES = 4 * 1024 * 1024
"""A multi-file upload is written in batches of about this many bytes (a file over it alone), so
the bytes held while writing are one batch, not the whole body."""
"""Parts one multipart upload may hold (files and fields together); the body as a whole is
bounded by BodyLimit (max_request_bytes), each file by max_file_bytes."""


def _content(part: bytes | UploadFile, limit: int) -> bytes:
    """A file's bytes (a multipart part is read from its spool file, in a worker thread)."""
    if isinstance(part, bytes):
        return part
    part.file.seek(0)
    data = part.file.read(limit + 1)
    if len(data) > limit:  # the part's size was checked; this only guards a lying spool
        raise PayloadTooLargeError(f"file is larger than the limit of {limit} bytes",
                                   details={"field": "file", "limit": limit})
    return data


class EnvdFiles:
    def __init__(self, services: Services) -> None:
        self.svc = services

    async def __call__(self, sb: E2BSandbox, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/health":
            return Response(status_code=204)
        if path != "/files":
            return envd_error(404, f"no route {method} {clip(path)} on envd")
        try:
            if method == "GET":
                return await self.download(sb, request)
            if method == "POST":
                return await self.upload(sb, request)
        except PathRefused as e:
            return envd_error(400, str(e))
        except SandboxError as e:
            return sandbox_error(e)
        return envd_error(405, f"{clip(method)} /files is not supported")

    async def download(self, sb: E2BSandbox, request: Request) -> Response:
        """The file's bytes, of any size (envd's ``http.ServeContent``): a file larger than one
        read (``READ_PIECE``) is streamed a range at a time, with its size as Content-Length."""
        rel = to_workspace(request.query_params.get("path") or "")

        def read(offset: int | None = None, length: int | None = None) -> bytes:
            return self.svc.runs.file_op(sb.tenant_id, sb.session_id, "read_bytes", rel, sb.token_id,
                                         lambda p, i: p.read_bytes(i, rel, offset=offset, length=length))

        first = await anyio.to_thread.run_sync(read, 0, READ_PIECE)
        total = getattr(first, "total_size", None)
        if total is None:  # a provider that cannot tell the size: the whole file in one read
            return Response(await anyio.to_thread.run_sync(read), media_type="application/octet-stream")
        if len(first) >= total:
            return Response(bytes(first), media_type="application/octet-stream")

        async def pieces() -> AsyncIterator[bytes]:
            yield bytes(first)
            sent = len(first)
            while sent < total:
                piece = await anyio.to_thread.run_sync(read, sent, min(READ_PIECE, total - sent))
                if not piece:
                    return  # the file shrank meanwhile: the body ends short of Content-Length, as envd's would
                yield bytes(piece)
                sent += len(piece)

        return StreamingResponse(pieces(), media_type="application/octet-stream",
                                 headers={"content-length": str(total)})

    async def _read_parts(self, request: Request, target: str | None, limit: int,
                          files: dict[str, bytes | UploadFile]) -> tuple[FormData | None, Response | None]:
        """Parse a multipart body into ``files`` (path -> its spooled part); the form (close it
        after the write) or an error response for a malformed body.

        Starlette spools each file part to disk past 1 MiB while parsing and BodyLimit bounds
        the body, so parsing holds little in memory; the files are read and written one at a
        time (``_content``), each at most ``limit`` bytes."""
        try:
            form = await request.form(max_files=MAX_PARTS, max_fields=MAX_PARTS, max_part_size=64 * 1024)
        except BodyTooLarge:
            raise  # BodyLimit answers 413
        except (StarletteHTTPException, MultiPartException, ValueError, KeyError) as e:
            detail = getattr(e, "detail", None) or getattr(e, "message", None) or str(e)
            return None, envd_error(400, f"malformed multipart body: {clip(detail, 200)}")
        items = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not items:
            return form, envd_error(400, "the multipart body holds no file")
        for item in items:
            if item.size is None or item.size > limit:
                return form, envd_error(413, f"file is larger than the limit of {limit} bytes")
            files[to_workspace((target if target and len(items) == 1 else item.filename) or "", write=True)] = item
        return form, None

    async def upload(self, sb: E2BSandbox, request: Request) -> Response:
        limit = self.svc.settings.max_file_bytes
        files: dict[str, bytes | UploadFile] = {}
        ctype = request.headers.get("content-type", "")
        target = request.query_params.get("path")
        form: FormData | None = None
        try:
            if ctype.startswith("multipart/form-data"):
                form, bad = await self._read_parts(request, target, limit, files)
                if bad is not None:
                    return bad
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
                files[to_workspace(target, write=True)] = data

            def put(prov: Any, instance_id: str) -> None:
                batch: dict[str, bytes] = {}  # small files go together; at most ~BATCH_BYTES held

                def flush() -> None:
                    if len(batch) == 1:
                        (p, d), = batch.items()
                        prov.write_file(instance_id, p, d, "overwrite")
                    elif batch:
                        prov.write_files(instance_id, dict(batch))
                    batch.clear()

                for p, d in files.items():
                    data = _content(d, limit)
                    if batch and sum(map(len, batch.values())) + len(data) > BATCH_BYTES:
                        flush()
                    batch[p] = data
                flush()

            def write() -> None:
                op = "write_file" if len(files) == 1 else "write_files"
                self.svc.runs.file_op(sb.tenant_id, sb.session_id, op, ",".join(files), sb.token_id, put)

            await anyio.to_thread.run_sync(write)
        finally:
            if form is not None:
                await form.close()
        return JSONResponse([{"name": posixpath.basename(p), "type": "file", "path": to_e2b(p)} for p in files])
