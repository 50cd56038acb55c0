"""How large one MCP request body may be (``EXECBOX_MCP_MAX_REQUEST_BYTES``), and the answer past it.

The MCP SDK's transport refuses a body over its ``max_request_body_size`` with a bare text/plain
413 that an SDK client reports only as "Server returned an error response". execbox checks the
same limit first (http.py: after authentication, before the SDK sees the request) and answers 413
with a JSON-RPC error body, which an SDK client raises as the error itself: message ``SB002: ...``
naming the size, the limit, the setting and how to send less (a large file through ``write_file``
in pieces, ``mode: "append"``), and ``data`` with the SB code and the numbers. The SDK gets the
same value, so the two never disagree.

The limit counts the request's bytes on the wire (base64 content and JSON escapes included);
default 4 MiB (the SDK's own default); never more than ``SANDBOX_MAX_REQUEST_BYTES``, which bounds
every route of ``execbox serve`` before this check (a body past it gets that limit's 413).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.types import Message, Receive

from ..settings import env_int

ENV = "EXECBOX_MCP_MAX_REQUEST_BYTES"
DEFAULT_MAX_REQUEST_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
"""4 MiB: a tool call's arguments are written by a model (a million tokens is ~4 MB), and the SDK
holds each request whole, several times over, while it parses and validates it."""
MINIMUM = 1024
REASON = "mcp_request_too_large"
INVALID_REQUEST = -32600  # JSON-RPC


def max_request_bytes_from_env(ceiling: int | None = None) -> int:
    """EXECBOX_MCP_MAX_REQUEST_BYTES (a whole number of bytes, at least 1024), or the default;
    at most ``ceiling`` (the service's SANDBOX_MAX_REQUEST_BYTES). A bad value is SB002 naming it."""
    value = env_int(ENV, DEFAULT_MAX_REQUEST_BYTES, MINIMUM)
    return min(value, ceiling) if ceiling else value


def refusal(limit: int, size: int | None) -> dict[str, object]:
    """The 413 body: a JSON-RPC error (``id`` null: the request was not read) in execbox's words."""
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    message = (f"SB002: this MCP request is {what}, over the {limit}-byte limit of one request ({ENV}; "
               "base64 content and JSON escapes count); nothing was done. Send less per call: write a large "
               "file with several write_file calls of at most a few MB each, the first with mode='overwrite' "
               "and the rest with mode='append' (for binary, split on a multiple of 3 bytes so each piece "
               "encodes to base64 alone); or ask the operator to raise the setting.")
    data = {"code": "SB002", "reason": REASON, "size": size, "limit": limit, "setting": ENV}
    return {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message, "data": data}}


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length, if it states a whole number."""
    raw = next((v for k, v in headers if k == b"content-length"), None)
    if raw is None or not raw.isdigit() or len(raw) > 20:
        return None
    return int(raw)


async def read_bounded(receive: Receive, limit: int) -> tuple[bytes | None, int,
                                                               Callable[[], Awaitable[Message]]]:
    """The whole request body (None once it passes ``limit``: reading stops there), the bytes read,
    and a receive that hands the same messages on again (as one body message)."""
    chunks: list[bytes] = []
    size = 0
    tail: Message | None = None
    while True:
        message = await receive()
        if message["type"] != "http.request":
            tail = message  # the client left: the app sees that after the body read so far
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            if not message.get("more_body", False):  # the whole body is in: nothing left to drain
                return None, size, _ended
            return None, size, receive
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    held: list[Message] = [{"type": "http.request", "body": body, "more_body": tail is not None}]
    if tail is not None:
        held.append(tail)

    async def replay() -> Message:
        return held.pop(0) if held else await receive()
    return body, size, replay


async def drain(receive: Receive, budget: int) -> None:
    """Read and drop up to ``budget`` more bytes of a refused body, so a client still sending it
    reads the 413 rather than a reset connection (the caller bounds the time)."""
    while budget >= 0:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


async def _ended() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
