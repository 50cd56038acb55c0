"""Error contract: one exception per SB code, each knowing the HTTP status a service answers.

The codes and meanings are RAGFlow's sandbox error table (SB001-SB009). Every error carries
``code``, ``message``, ``details`` and ``http_status`` so that the library, the CLI and the
HTTP service all speak the same shape: ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

from typing import Any


class SandboxError(Exception):
    """Base class: a failure with an SB code, a human message and machine-readable details."""

    code: str = "SB000"
    http_status: int = 500
    resolution: str = ""

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        if http_status is not None:
            self.http_status = http_status

    def to_dict(self) -> dict[str, Any]:
        """The one JSON error shape every interface returns."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ProviderNotInitializedError(SandboxError):
    code = "SB001"
    http_status = 503
    resolution = "Configure the provider (admin console, `execbox config`, or SANDBOX_TYPE)."


class InvalidConfigError(SandboxError):
    """Bad configuration or bad request input (a field that cannot be accepted)."""

    code = "SB002"
    http_status = 400
    resolution = "Check the configuration or request values named in details."


class ConnectionFailedError(SandboxError):
    code = "SB003"
    http_status = 502
    resolution = "Check the network path and credentials of the provider."


class InstanceCreationError(SandboxError):
    code = "SB004"
    http_status = 503
    resolution = "Check the provider's capacity (pool size, max sessions) and host resources."


class ExecutionTimeoutError(SandboxError):
    code = "SB005"
    http_status = 408
    resolution = "Increase the timeout or make the code faster."


class OutOfMemoryError(SandboxError):
    code = "SB006"
    http_status = 422
    resolution = "Reduce memory usage or raise the provider's max_memory."


class CodeBlockedError(SandboxError):
    code = "SB007"
    http_status = 400
    resolution = "Remove the blocked import or call (see details.line)."


class RateLimitError(SandboxError):
    code = "SB008"
    http_status = 429
    resolution = "Reduce concurrency or raise the limit."


class ProviderUnavailableError(SandboxError):
    code = "SB009"
    http_status = 503
    resolution = "Check the provider's status, or configure a fallback provider."


# Request-level refinements: same SB code, a more precise HTTP status.


class PathError(InvalidConfigError):
    """A workspace path that fails validation (absolute, '..', NUL, escaping symlink)."""


class FileNotFoundInSandbox(InvalidConfigError):
    http_status = 404


class PayloadTooLargeError(InvalidConfigError):
    http_status = 413


class NotTextError(InvalidConfigError):
    """A text read (paged ``read``) of a file that holds binary data: a NUL byte in its first
    8 KiB (``details.reason`` is ``binary``). Read its bytes instead: HTTP ``read_binary``, the
    SDK's ``files.read_bytes()``, MCP's file resource."""


class SessionNotFoundError(InvalidConfigError):
    http_status = 404


class SessionLostError(ProviderUnavailableError):
    """The registry knows the session but its workspace is gone (its host or disk was lost):
    nothing can be recovered; delete it (or let its retention expire) to reuse the name."""

    http_status = 410


class SandboxClosedError(InvalidConfigError):
    """A client object (``Sandbox``, ``RemoteSandbox``, their async forms) used after ``close()``:
    the caller's mistake, found on the client side; nothing was sent. Create a new one to go on
    (``close()`` ended its session: files and contexts are gone)."""

    http_status = 409


class SessionDrainingError(ProviderUnavailableError):
    """The replica is shutting down (SIGTERM): it takes no new work; retry on another replica."""


SEE_LOG = "the server log has the details"


class BoxStartFailed(InstanceCreationError):
    """A box that did not start, told twice: ``message`` and ``details`` are what the tenant reads
    (no host paths, mount or engine output), ``reason`` is the whole error, for the server log and
    the operator's own reports (`execbox doctor`, the admin console's provider test)."""

    def __init__(self, message: str, reason: str = "", *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.reason = reason


def operator_message(e: SandboxError) -> str:
    """``CODE: message`` for an operator's eyes: with the whole reason a tenant's message leaves out."""
    text = f"{e.code}: {e.message}"
    return f"{text} [{e.reason}]" if isinstance(e, BoxStartFailed) and e.reason else text


ERRORS_BY_CODE: dict[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        ProviderNotInitializedError,
        InvalidConfigError,
        ConnectionFailedError,
        InstanceCreationError,
        ExecutionTimeoutError,
        OutOfMemoryError,
        CodeBlockedError,
        RateLimitError,
        ProviderUnavailableError,
    )
}


def error_from_dict(payload: dict[str, Any], http_status: int | None = None) -> SandboxError:
    """Rebuild a typed error from its JSON shape (remote clients, the agent's error replies).

    The status refines SB002 where it can (404: FileNotFoundInSandbox, 413: PayloadTooLargeError),
    an SB002 naming a path ``violation`` (the agent's one path validator refused it) is a
    PathError, and one whose ``reason`` is ``binary`` a NotTextError, so a caller catches the same
    class whichever side of a wire raised it.
    """
    body = payload.get("error", payload)
    code = str(body.get("code"))
    details = body.get("details") or {}
    cls: type[SandboxError]
    if code == "SB002" and isinstance(details, dict) and "violation" in details:
        cls = PathError
    elif code == "SB002" and http_status in (None, 400) and isinstance(details, dict) \
            and details.get("reason") == "binary":
        cls = NotTextError
    else:
        cls = _REFINED.get((code, http_status)) or ERRORS_BY_CODE.get(code, SandboxError)
    return cls(str(body.get("message", "")), details=details, http_status=http_status)


_REFINED: dict[tuple[str, int | None], type[SandboxError]] = {
    ("SB002", 404): FileNotFoundInSandbox, ("SB002", 413): PayloadTooLargeError}
