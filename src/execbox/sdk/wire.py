"""Wire format shared by the sync and async HTTP clients: bodies, SSE parsing, error mapping."""


from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx

from ..errors import ConnectionFailedError, SandboxError, error_from_dict
from ..models import ExecutionResult
from ..providers.base import OutputCallback

API_PREFIX = "/v1/sandbox"
DEFAULT_HTTP_TIMEOUT = 30.0
HTTP_GRACE = 30.0  # seconds beyond an execution's own timeout before the client gives up


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len(API_PREFIX)] if url.endswith(API_PREFIX) else url


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _content(content: str | bytes) -> dict[str, str]:
    if isinstance(content, bytes):
        return {"content_b64": base64.b64encode(content).decode()}
    return {"content": content}


def _error(response: httpx.Response) -> SandboxError:
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    if not isinstance(payload, dict) or "error" not in payload:
        return SandboxError(f"HTTP {response.status_code} from {response.request.url.path}: "
                            f"{response.text[:200]}", http_status=response.status_code)
    return error_from_dict(payload, response.status_code)


def _result_or_raise(err: SandboxError, fetcher: Any) -> ExecutionResult:
    """SB005/SB006 carry the partial result: hand it back like the local Sandbox does."""
    body = err.details.get("result") if isinstance(err.details, dict) else None
    if err.code in ("SB005", "SB006") and isinstance(body, dict):
        return ExecutionResult.from_dict(body, fetcher)
    raise err


class _SSE:
    """Incremental parser of text/event-stream lines into (event, data) pairs."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, Any] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, json.loads("\n".join(self.data)))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


class _StreamState:
    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.artifacts: list[dict[str, Any]] = []

    def handle(self, event: str, data: Any) -> None:
        if event in ("stdout", "stderr"):
            if self.on_output is not None:
                self.on_output(event, data.get("text", ""))
        elif event == "artifact":
            self.artifacts.append(data)
        elif event == "result":
            self.result = data
        elif event == "error":
            self.error = data

    def finish(self, fetcher: Any) -> ExecutionResult:
        if self.result is not None:
            return ExecutionResult.from_dict(self.result, fetcher)
        if self.error is not None:
            raise error_from_dict({"error": self.error})
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
        return (timeout or DEFAULT_HTTP_TIMEOUT) + HTTP_GRACE




def iter_events(response_lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """Parse SSE lines (e.g. ``httpx.Response.iter_lines()``) into (event, data) pairs."""
    parser = _SSE()
    for line in response_lines:
        item = parser.feed(line)
        if item is not None:
            yield item

