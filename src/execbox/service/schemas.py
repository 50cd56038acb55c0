"""Request and response bodies of the /v1/sandbox API (pydantic; they are the OpenAPI schema).

Limits that depend on ServiceSettings (code and file sizes) are checked in the routes, so the
413 carries the configured limit; everything static is declared here and rejected as 400 SB002.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..agent.fileops import MAX_READ_BYTES
from .sessions import NAME_PATTERN

Name = Field(default=None, pattern=NAME_PATTERN, max_length=64)
Timeout = Field(default=None, gt=0, le=86400, allow_inf_nan=False,
                description="Seconds; the provider's max_timeout applies")


def _utf8(value: Any, depth: int = 0) -> None:
    """Refuse text with no UTF-8 form (a lone surrogate, JSON "\\ud800"): it can reach no box."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text holds a lone UTF-16 surrogate (not valid UTF-8)") from None
    elif depth < 32 and isinstance(value, dict):
        for k, v in value.items():
            _utf8(k, depth + 1)
            _utf8(v, depth + 1)
    elif depth < 32 and isinstance(value, list):
        for v in value:
            _utf8(v, depth + 1)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _valid_utf8(cls, value: Any) -> Any:
        _utf8(value)
        return value


class Scoped(_Body):
    tenant_id: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64,
                                  description="Defaults to the token's tenant; another tenant's id is 403")
    session_id: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64,
                                   description="Created on first use")


NetworkForRun = Field(default=None, description="Narrow the network policy for this run only: {\"network\": "
                                                 "\"none|allowlist|open\", \"allow\": [...]} (403 if wider)")


RuntimeField = Field(default=None, max_length=80, pattern=r"^[a-z0-9][a-z0-9_.-]*(@v?[0-9]+)?$",
                     description="Runtime template (NAME or NAME@vN, `execbox runtime list`) for a new session "
                                 "or one-shot box; a live session keeps the one it started with (409 if different)")


class ExecuteRequest(Scoped):
    code: str
    runtime: str | None = RuntimeField
    network: dict[str, Any] | None = NetworkForRun
    language: str = Field(default="python", max_length=32, description="python, javascript (nodejs), bash")
    timeout: float | None = Timeout
    arguments: dict[str, Any] | None = Field(default=None, description="main(**arguments) / main(arguments)")
    context_id: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64,
                                   description="Stateful context in a session: globals persist")
    stream: bool = Field(default=False, description="Answer with server-sent events (also Accept: "
                                                    "text/event-stream)")


class BashRequest(Scoped):
    command: str
    runtime: str | None = RuntimeField
    network: dict[str, Any] | None = NetworkForRun
    cwd: str | None = Field(default=None, max_length=4096, description="Relative to the workspace")
    timeout: float | None = Timeout
    env: dict[str, str] | None = None
    stream: bool = False


class SessionFileRequest(_Body):
    tenant_id: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    session_id: str = Field(pattern=NAME_PATTERN, max_length=64)


class ReadRequest(SessionFileRequest):
    path: str = Field(max_length=4096)
    offset: int = Field(default=0, ge=0, le=2**31)
    limit: int = Field(default=2000, ge=1, le=100000)


class ReadBinaryRequest(SessionFileRequest):
    path: str = Field(max_length=4096)
    offset: int | None = Field(default=None, ge=0, le=2**62,
                               description="First byte to read (default 0); past the file's end is 400")
    length: int | None = Field(default=None, ge=0, le=MAX_READ_BYTES,
                               description="Bytes to read from offset, at most 64 MiB (fewer at the end of the "
                                           "file). Without it the file from offset on, which must fit 64 MiB (413)")


class WriteRequest(SessionFileRequest):
    path: str = Field(max_length=4096)
    content: str | None = Field(default=None, description="Text (UTF-8); or content_b64")
    content_b64: str | None = Field(default=None, description="Base64 bytes; or content")
    mode: Literal["overwrite", "append", "create"] = "overwrite"


class GrepRequest(SessionFileRequest):
    pattern: str = Field(max_length=4096, description="Python regular expression")
    path: str = Field(default=".", max_length=4096)
    glob: str | None = Field(default=None, max_length=4096)
    max_results: int = Field(default=100, ge=1, le=10000)


class GlobRequest(SessionFileRequest):
    pattern: str = Field(max_length=4096)
    max_results: int = Field(default=1000, ge=1, le=10000, description="At most this many paths (truncated: more "
                                                                      "matched)")


class ListRequest(SessionFileRequest):
    path: str = Field(default=".", max_length=4096)
    recursive: bool = False


class FileItem(_Body):
    path: str = Field(max_length=4096)
    content: str | None = None
    content_b64: str | None = None


class CopyRequest(_Body):
    files: list[FileItem] = Field(min_length=1, max_length=10000)


# -- responses ---------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(BaseModel):
    error: ErrorDetail


class ArtifactOut(BaseModel):
    name: str
    mime_type: str
    size: int
    sha256: str
    path: str
    content_b64: str | None = None


class ExecutionErrorOut(BaseModel):
    """The exception that ended the user's code (E2B's ``execution.error``, Jupyter's
    ename/evalue/traceback)."""

    name: str = Field(description="the exception's type name: ZeroDivisionError, TypeError")
    value: str = Field(description="its message: str(exception) in Python, error.message in JavaScript")
    traceback: str = Field(description="the traceback (Python) or stack (JavaScript) as printed on stderr")


class ExecutionOut(BaseModel):
    stdout: str
    stderr: str
    exit_code: int
    execution_time: float
    timed_out: bool
    truncated: bool
    result: Any = None
    artifacts: list[ArtifactOut]
    error: ExecutionErrorOut | None = Field(
        default=None, description="the uncaught exception of a Python or JavaScript run; null when the code "
        "raised nothing (sys.exit is not an error), for bash, and where the provider cannot say")
    metadata: dict[str, Any]
    tenant_id: str
    session_id: str | None


class TextPageOut(BaseModel):
    path: str
    content: str
    offset: int
    limit: int
    total_lines: int
    truncated: bool


class BinaryOut(BaseModel):
    path: str
    size: int = Field(description="Bytes in content_b64")
    sha256: str = Field(description="Of the bytes in content_b64")
    content_b64: str
    offset: int = Field(default=0, description="Where in the file content_b64 starts")
    total_size: int = Field(description="The file's size: read a larger file in pieces with offset and length")


class FileInfoOut(BaseModel):
    path: str
    size: int
    is_dir: bool
    modified: float
    symlink_target: str | None = None


class FilesOut(BaseModel):
    files: list[FileInfoOut]


class GrepMatchOut(BaseModel):
    path: str
    line_number: int
    line: str


class SkippedFileOut(BaseModel):
    path: str
    reason: str = Field(description="unreadable: could not be read; not_regular: a FIFO, socket or device; "
                                    "long_line: a line over 8 MiB was searched in 8 MiB pieces (a match across "
                                    "two is missed)")


class GrepOut(BaseModel):
    matches: list[GrepMatchOut]
    truncated: bool = Field(default=False, description="More matched than max_results: narrow the pattern or "
                                                       "raise max_results")
    binary_matches: list[str] = Field(default_factory=list, description="Binary files (a NUL byte in their first "
                                      "8 KiB) that match; their lines are not returned (read_binary)")
    skipped: list[SkippedFileOut] = Field(default_factory=list, description="Files not searched, or only in part "
                                          "(the first 100)")
    skipped_names: int = Field(default=0, description="Names not valid UTF-8 left out of the search")


class GlobOut(BaseModel):
    paths: list[str]
    truncated: bool = Field(default=False, description="More matched than max_results")
    skipped_names: int = Field(default=0, description="Names not valid UTF-8 left out")


class SessionOut(BaseModel):
    """A session from the registry; the live counters come from its owning replica (null when
    another replica owns it)."""

    tenant_id: str
    session_id: str
    state: str = Field(description="creating, running, paused, closing, closed or lost")
    owner: str | None = Field(default=None, description="The replica that owns the session's box")
    provider: str | None
    instance_id: str | None
    created_at: float
    last_used: float | None = None
    expires_at: float | None = Field(default=None, description="A running session: when the idle reaper takes it "
                                     "if it stays unused (last use + SANDBOX_IDLE_TIMEOUT; SANDBOX_IDLE_ACTION says "
                                     "what happens then); a paused or lost one: when it is deleted; a closing one: "
                                     "when a destroy cut off is finished")
    lease_expires: float | None = None
    contexts_lost: bool = Field(default=False, description="In-memory contexts (Python globals) were lost by "
                                "a restart or pause; files are intact")
    idle_seconds: float | None = None
    busy: bool = False
    operations: int | None = None
    boxes_started: int | None = None
    network: dict[str, Any] | None = None  # issue 14: the effective egress policy
    runtime: str | None = Field(default=None, description="Runtime template the session was started with "
                                "(null: the provider's default)")


class SessionsOut(BaseModel):
    sessions: list[SessionOut]


class WhoAmI(BaseModel):
    tenant_id: str
    role: str
    token_id: str


class DestroyedOut(BaseModel):
    destroyed: SessionOut


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in {
        400: "Invalid request (SB002 and the field), blocked code (SB007)",
        401: "Missing or invalid token",
        403: "Token may not touch this tenant or route",
        404: "Unknown session or file",
        408: "Execution timed out (SB005); details.result holds the partial result",
        409: "File exists (write mode=create)",
        413: "Body, code or file too large",
        422: "Out of memory (SB006); details.result holds the partial result",
        429: "Per-tenant limit reached (SB008)",
        501: "The active provider does not support this operation",
        502: "Provider connection failed (SB003)",
        503: "No capacity (SB004) or provider unavailable (SB001/SB009)",
        507: "Workspace quota exceeded while writing (SB002)",
    }.items()
}
