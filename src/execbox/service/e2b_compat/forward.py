"""A sandbox URL request for a sandbox whose session another replica owns goes to that replica.

The service's own forwarding (service/forwarding.py) buffers a request's whole body and signs
it, then replays it. The sandbox URL cannot work that way: uploads are streamed to disk as they
come, and envd's client-streaming calls (a process's stdin) send their body for as long as the
caller likes. So here the request is relayed as a stream, both ways, to the owner's URL. The
marker header says it was forwarded, so the owner serves it and never forwards it again; it is
signed with the replicas' shared secret over replica, time, method and path (not the body: that
is still arriving). The marker only stops a second hop; the owner authenticates the request by
its sandbox access token as usual, which is passed on unchanged with every other header.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.responses import JSONResponse

from ..config import internal_secret, replica_base_url
from ..forwarding import HEADER, OWNER_LOST, owner_url, sign, until_caller_leaves, verify

log = logging.getLogger("execbox.service.e2b")

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection", HEADER}
"""Not passed on, either way. A request's content-length goes too (its body is re-sent chunked);
an answer's stays, so a caller can tell an answer cut short from a whole one."""
_SKIP = {"date", "server"}  # the answering server sets its own


class CallerGone(Exception):
    """The caller went away before its request body was whole: the owner must not take it as done."""


def forwarded_here(scope: dict[str, Any]) -> bool | None:
    """None: not a forwarded request; True: forwarded by a replica (valid marker); False: a
    marker that does not verify (forged, or too old)."""
    raw = next((v for k, v in scope.get("headers", []) if k.lower() == HEADER.encode()), None)
    if raw is None:
        return None
    secret = internal_secret()
    return bool(secret) and verify(secret, raw.decode("latin-1"), scope["method"], _path(scope), b"")


def can_forward(target: str | None) -> bool:
    return bool(target) and bool(internal_secret()) and replica_base_url(str(target))


def _path(scope: dict[str, Any]) -> str:
    return scope.get("raw_path", scope["path"].encode()).decode("latin-1")


async def relay(target: str, replica: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Stream the request to ``target`` (another replica's base URL) and its answer back."""
    method, path = scope["method"], _path(scope)
    query = scope.get("query_string", b"")
    url = owner_url(target, path, query)
    if url is None:
        await JSONResponse({"code": 400, "message": "bad request target"}, status_code=400)(scope, receive, send)
        return
    stamp = f"{time.time():.3f}"
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])
               if k.decode("latin-1").lower() not in _HOP | {"content-length"}]
    headers.append((HEADER, f"{replica}:{stamp}:{sign(internal_secret(), replica, stamp, method, path, b'')}"))
    body_done = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise CallerGone
                chunk = msg.get("body", b"")
                if chunk:
                    yield chunk
                if not msg.get("more_body"):
                    return
        finally:
            body_done.set()

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0)) as client:
        try:
            resp = await client.send(client.build_request(method, url, headers=headers, content=body()),
                                     stream=True)
        except CallerGone:  # the owner saw the body end early (an incomplete chunked body): nothing done
            return
        except httpx.HTTPError as e:
            log.warning("forwarding e2b sandbox request %s %s to %s failed: %s", method, path, target, e)
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):  # nothing reached the owner
                status, message = 502, "the replica serving this sandbox did not answer; try again"
            else:  # it may have acted on the request
                status, message = 503, OWNER_LOST
            await JSONResponse({"code": status, "message": message}, status_code=status)(scope, receive, send)
            return
        try:
            out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.multi_items()
                   if k.lower() not in _HOP | _SKIP]
            out.append((b"x-execbox-served-by", target.encode("latin-1")))
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
            await _pass_on(resp, receive, send, body_done)
        finally:
            await resp.aclose()


async def _pass_on(resp: httpx.Response, receive: Any, send: Any, body_done: asyncio.Event) -> None:
    """The answer's bytes as they come (raw: its content-encoding header went with them); stop,
    closing the owner's stream, once the caller is gone."""

    async def pump() -> None:
        try:
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as e:  # the owner went away mid-answer: break ours off, never end it
            log.warning("forwarded e2b sandbox answer from %s broke: %s", resp.url, e)
            raise  # (the server drops the connection: the caller sees a broken answer, not a short one)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    await until_caller_leaves(pump, receive, body_done)
