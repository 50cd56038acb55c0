"""Bounded HTTP exchanges with servers that are not fully trusted (the SDK's service, self_managed's
executor): a wall-clock deadline on the whole exchange and a size cap on what is buffered.

httpx's timeouts are per read, so a server that trickles one byte every few seconds, or sends SSE
keep-alives forever, never trips them; ``response.json()`` and ``iter_lines()`` buffer a body or a
line of any size. Here, for sync clients, a deadline lives in a context variable for the duration
of one exchange, and a wrapped network backend clamps every socket read and write to the time it
has left (so a trickle cannot outlast it, in the headers or the body; the async client wraps the
exchange in ``asyncio.timeout`` instead); bodies and lines are read incrementally against a size
cap. Both failures are typed SB errors naming the bound.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from ..errors import ConnectionFailedError, SandboxError

MiB = 1024 * 1024
MAX_RESPONSE_BYTES = 128 * MiB
"""The largest reply body, SSE line or SSE event buffered (a whole event stream: twice this). A
legitimate one stays below it: a /run answer carries at most 64 MiB of inline artifacts (85.4 MiB
as base64, routes/executor_results.MAX_ARTIFACT_BYTES) plus output capped at 1 MiB per stream by default;
``read_binary`` at most a 64 MiB file (agent/fileops.MAX_READ_BYTES), also 85.4 MiB as base64."""
CALL_DEADLINE = 300.0
"""Wall-clock bound on a call that is not a run (file operations, session calls): generous enough
for a 64 MiB file over a slow link, finite against a server that trickles."""

_DEADLINE: ContextVar[float | None] = ContextVar("execbox_http_deadline", default=None)


class Deadline:
    """One exchange's wall-clock limit, ``seconds`` from its start, and the error it ends with."""

    def __init__(self, seconds: float, error: type[SandboxError], message: str) -> None:
        self.seconds, self.error, self.message = seconds, error, message
        self.at = time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def failure(self) -> SandboxError:
        return self.error(self.message, details={"deadline_s": round(self.seconds, 3)})

    def check(self) -> None:
        """Between chunks: covers clients whose transport has no clamped backend (a caller's own)."""
        if self.expired:
            raise self.failure()


@contextlib.contextmanager
def deadline(seconds: float, error: type[SandboxError] = ConnectionFailedError,
             message: str | None = None) -> Iterator[Deadline]:
    """Every socket read and write of this thread's exchanges inside (on clamped transports) ends
    by the deadline; ``error(message)`` is what a caller raises once it passed."""
    d = Deadline(seconds, error, message or f"the server did not finish answering within {seconds:g}s; gave up")
    token = _DEADLINE.set(d.at)
    try:
        yield d
    finally:
        _DEADLINE.reset(token)


def _clamp(timeout: float | None, exc: type[Exception]) -> float | None:
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc("the exchange's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname,
                                             _clamp(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _clamp(timeout, httpcore.ConnectTimeout),
                                               local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _clamp(timeout, httpcore.ConnectTimeout),
                                                       socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def clamp_transport(transport: Any) -> Any:
    """Make ``transport``'s socket I/O obey :func:`deadline` (no effect outside one). Transports
    that are not httpx's own (a test's MockTransport) are left alone: the between-chunk checks
    still bound them, one read late at most."""
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if isinstance(inner, httpcore.NetworkBackend) and not isinstance(inner, _Backend):
        pool._network_backend = _Backend(inner)  # type: ignore[union-attr]
    return transport


def clamp_client(client: httpx.Client) -> httpx.Client:
    """:func:`clamp_transport` on a client's transport and its proxy mounts."""
    clamp_transport(getattr(client, "_transport", None))
    for mounted in (getattr(client, "_mounts", None) or {}).values():
        clamp_transport(mounted)
    return client


def too_large(limit: int, what: str, error: type[SandboxError]) -> SandboxError:
    return error(f"{what} is larger than the client's limit of {limit} bytes; refused",
                 details={"limit_bytes": limit})


class BodyCap:
    """Accumulates a body's chunks, refusing more than ``limit`` bytes (sans-IO: sync and async)."""

    def __init__(self, limit: int, what: str, error: type[SandboxError] = ConnectionFailedError) -> None:
        self.limit, self.what, self.error = limit, what, error
        self.buf = bytearray()

    def declared(self, headers: httpx.Headers) -> None:
        """Refuse at once a body whose Content-Length is over the limit (nothing of it read)."""
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limit:
            raise too_large(self.limit, self.what, self.error)

    def add(self, chunk: bytes) -> None:
        if len(self.buf) + len(chunk) > self.limit:
            raise too_large(self.limit, self.what, self.error)
        self.buf += chunk


def read_body(response: httpx.Response, limit: int, dl: Deadline, what: str,
              error: type[SandboxError] = ConnectionFailedError) -> bytes:
    """The body of a streamed response, at most ``limit`` bytes, by the deadline."""
    cap = BodyCap(limit, what, error)
    cap.declared(response.headers)
    for chunk in response.iter_bytes():
        dl.check()
        cap.add(chunk)
    return bytes(cap.buf)


class LineSplitter:
    """Text chunks -> lines (``\\n`` or ``\\r\\n``), none longer than ``limit`` characters and at
    most ``total`` characters in all: unlike ``iter_lines()``, a line that never ends is refused."""

    def __init__(self, limit: int, total: int, what: str, error: type[SandboxError] = ConnectionFailedError) -> None:
        self.limit, self.total, self.what, self.error = limit, total, what, error
        self.pending: list[str] = []  # parts of the unfinished line (joined once, when it ends)
        self.pending_len = 0
        self.seen = 0

    def feed(self, text: str) -> list[str]:
        self.seen += len(text)
        if self.seen > self.total:
            raise too_large(self.total, self.what, self.error)
        *ends, rest = text.split("\n")
        lines: list[str] = []
        if ends:
            lines = ["".join([*self.pending, ends[0]]), *ends[1:]]
            self.pending, self.pending_len = [], 0
        if rest:
            self.pending.append(rest)
            self.pending_len += len(rest)
        if self.pending_len > self.limit or any(len(line) > self.limit for line in lines):
            raise too_large(self.limit, f"a line of {self.what}", self.error)
        return [line.removesuffix("\r") for line in lines]

    def close(self) -> list[str]:
        rest = "".join(self.pending).removesuffix("\r")
        self.pending, self.pending_len = [], 0
        return [rest] if rest else []


def bounded_lines(chunks: Iterable[str], splitter: LineSplitter, dl: Deadline) -> Iterator[str]:
    for chunk in chunks:
        dl.check()
        yield from splitter.feed(chunk)
    yield from splitter.close()
