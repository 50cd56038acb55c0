"""Wire format shared by the sync and async HTTP clients: bodies, SSE parsing, reply validation.

Every reply is checked for the shape it must have before it is used: a proxy's HTML page, a
redirect, a list where an object belongs or an undecodable field is a typed ``SandboxError``
(SB003, the answer did not come from a working execbox), never a bare ``ValueError``.
"""


from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import (
    ConnectionFailedError,
    ProviderUnavailableError,
    SandboxClosedError,
    SandboxError,
    error_from_dict,
)
from ..models import ExecutionResult
from ..providers.base import OutputCallback
from .bounded import MAX_RESPONSE_BYTES, too_large

API_PREFIX = "/v1/sandbox"
DEFAULT_HTTP_TIMEOUT = 30.0
HTTP_GRACE = 30.0  # seconds beyond an execution's own timeout before the client gives up
UNTIMED_RUN = 3600.0
"""A run that names no timeout gets the service's default, unknown here: bounded by the largest
timeout any provider's config accepts (3600 s) plus HTTP_GRACE."""

T = TypeVar("T")


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len(API_PREFIX)] if url.endswith(API_PREFIX) else url


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _content(content: str | bytes) -> dict[str, str]:
    if isinstance(content, bytes):
        return {"content_b64": base64.b64encode(content).decode()}
    return {"content": content}


def closed_error(kind: str, session_id: str | None) -> SandboxClosedError:
    """A client used after ``close()`` (nothing is sent): SB002, the caller's mistake, not a server's."""
    return SandboxClosedError(f"this {kind} is closed: close() ended session {session_id!r} (its files and "
                              f"contexts are gone); create a new {kind} to go on",
                              details={"session_id": session_id, "reason": "closed"})


def malformed(what: str, status: int | None = None) -> ConnectionFailedError:
    """A reply that is not what an execbox service sends (a proxy's page, a broken or hostile server)."""
    details: dict[str, Any] = {} if status is None else {"http_status": status}
    return ConnectionFailedError(f"the service's answer is not a valid execbox reply: {what}", details=details)


def decode(what: str, build: Callable[[], T]) -> T:
    """``build()``, with any failure to decode the reply's fields as a typed error."""
    try:
        return build()
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # binascii.Error is a ValueError
        raise malformed(f"{what} ({type(e).__name__})") from None


@dataclass
class Reply:
    """A complete HTTP answer, read within the client's deadline and size cap."""

    status: int
    content: bytes
    path: str

    def json(self) -> Any:
        try:
            return json.loads(self.content)
        except ValueError:
            raise malformed(f"HTTP {self.status} with a body that is not JSON", self.status) from None

    def obj(self) -> dict[str, Any]:
        out = self.json()
        if not isinstance(out, dict):
            raise malformed(f"HTTP {self.status} with a JSON {type(out).__name__}, not an object", self.status)
        return out


def typed_error(err: dict[str, Any], http_status: int | None = None) -> SandboxError:
    """An ``{"code", "message", "details"}`` object (however malformed its fields) as its SB class."""
    details = err.get("details")
    clean = {"code": str(err.get("code") or ""), "message": str(err.get("message") or ""),
             "details": details if isinstance(details, dict) else {}}
    return error_from_dict({"error": clean}, http_status)


def reply_error(reply: Reply) -> SandboxError:
    status = reply.status
    if 300 <= status < 400:
        return ConnectionFailedError(f"HTTP {status} redirect from {reply.path}, not followed "
                                     "(point the client at the service's own URL)", details={"http_status": status})
    try:
        payload = json.loads(reply.content)
    except ValueError:
        payload = None
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):  # a proxy's page, another server's 500: not an execbox bug (SB000)
        text = reply.content[:200].decode("utf-8", "replace")
        return ProviderUnavailableError(f"HTTP {status} from {reply.path} did not carry execbox's error object: "
                                        f"{text}", http_status=status)
    return typed_error(err, status)


def result_from(body: Any, fetcher: Any) -> ExecutionResult:
    """A run's result object, validated."""
    if not isinstance(body, dict):
        raise malformed(f"a run result that is a JSON {type(body).__name__}, not an object")
    r = decode("a run result with fields of the wrong type", lambda: ExecutionResult.from_dict(body, fetcher))
    if not (isinstance(r.stdout, str) and isinstance(r.stderr, str)
            and all(isinstance(a.name, str) and isinstance(a.path, str) for a in r.artifacts)):
        raise malformed("a run result with fields of the wrong type")
    return r


def _result_or_raise(err: SandboxError, fetcher: Any) -> ExecutionResult:
    """SB005/SB006 carry the partial result: hand it back like the local Sandbox does."""
    body = err.details.get("result") if isinstance(err.details, dict) else None
    if err.code in ("SB005", "SB006") and isinstance(body, dict):
        return result_from(body, fetcher)
    raise err


class _SSE:
    """Incremental parser of text/event-stream lines into (event, data) pairs; one event's data
    is at most ``limit`` characters (lines come from a bounded splitter)."""

    def __init__(self, limit: int = MAX_RESPONSE_BYTES) -> None:
        self.event = "message"
        self.data: list[str] = []
        self.size = 0
        self.limit = limit

    def feed(self, line: str) -> tuple[str, Any] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            try:
                out = (self.event, json.loads("\n".join(self.data)))
            except ValueError:
                raise malformed(f"a {self.event!r} event whose data is not JSON") from None
            finally:
                self.event, self.data, self.size = "message", [], 0
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.size += len(value) + 1
            if self.size > self.limit:
                raise too_large(self.limit, "one event of the stream", ConnectionFailedError)
            self.data.append(value)
        return None


class _StreamState:
    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.artifacts: list[dict[str, Any]] = []

    def handle(self, event: str, data: Any) -> None:
        if event in ("stdout", "stderr", "artifact", "result", "error") and not isinstance(data, dict):
            raise malformed(f"a {event!r} event whose data is a JSON {type(data).__name__}, not an object")
        if event in ("stdout", "stderr"):
            text = data.get("text", "")
            if not isinstance(text, str):
                raise malformed(f"a {event!r} event whose text is not a string")
            if self.on_output is not None:
                self.on_output(event, text)
        elif event == "artifact":
            self.artifacts.append(data)
        elif event == "result":
            self.result = data
        elif event == "error":
            self.error = data

    def finish(self, fetcher: Any) -> ExecutionResult:
        if self.result is not None:
            return result_from(self.result, fetcher)
        if self.error is not None:
            raise typed_error(self.error)
        raise ConnectionFailedError("the event stream ended without a result")


class _Requests:
    """Request bodies shared by the sync and async clients."""

    def __init__(self, tenant_id: str | None, session_id: str | None) -> None:
        self.tenant_id = tenant_id
        self.session_id = session_id

    def scoped(self, **fields: Any) -> dict[str, Any]:
        body = {k: v for k, v in fields.items() if v is not None}
        if self.tenant_id is not None:
            body["tenant_id"] = self.tenant_id
        if self.session_id is not None:
            body["session_id"] = self.session_id
        return body

    @staticmethod
    def http_timeout(timeout: float | None) -> float:
        """The wall-clock bound on one run's whole exchange: its timeout plus HTTP_GRACE."""
        return (timeout if timeout else UNTIMED_RUN) + HTTP_GRACE


def run_deadline_message(where: str, timeout: float | None) -> str:
    budget = f"its timeout {timeout:g}s" if timeout else f"no timeout given: {UNTIMED_RUN:g}s"
    return (f"{where} did not finish answering the run within {_Requests.http_timeout(timeout):g}s "
            f"({budget} + {HTTP_GRACE:g}s grace); gave up, not retried")


def iter_events(response_lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """Parse SSE lines (e.g. ``httpx.Response.iter_lines()``) into (event, data) pairs."""
    parser = _SSE()
    for line in response_lines:
        item = parser.feed(line)
        if item is not None:
            yield item
