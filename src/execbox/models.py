"""Data contracts shared by every provider and interface."""

from __future__ import annotations

import base64
import enum
import hashlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import InvalidConfigError


class Language(enum.StrEnum):
    PYTHON = "python"
    JAVASCRIPT = "javascript"
    BASH = "bash"

    @classmethod
    def parse(cls, value: str | Language) -> Language:
        """Accept the canonical names and their aliases (nodejs, js, sh, py)."""
        if isinstance(value, Language):
            return value
        key = str(value or "").strip().lower()
        lang = _LANGUAGE_ALIASES.get(key)
        if lang is None:
            raise InvalidConfigError(
                f"unknown language {value!r}; supported: python, javascript (nodejs, js), bash",
                details={"field": "language", "value": str(value)},
            )
        return lang


_LANGUAGE_ALIASES = {
    "python": Language.PYTHON,
    "python3": Language.PYTHON,
    "py": Language.PYTHON,
    "javascript": Language.JAVASCRIPT,
    "nodejs": Language.JAVASCRIPT,
    "node": Language.JAVASCRIPT,
    "js": Language.JAVASCRIPT,
    "bash": Language.BASH,
    "sh": Language.BASH,
    "shell": Language.BASH,
}


class Isolation(enum.StrEnum):
    """Security tiers, strongest first in TIER_ORDER."""

    GVISOR = "gvisor"
    CONTAINER = "container"
    JAIL = "jail"
    NONE = "none"


TIER_ORDER = [Isolation.GVISOR, Isolation.CONTAINER, Isolation.JAIL, Isolation.NONE]


def make_instance_id(tenant_id: str, session_id: str | None) -> str:
    """Instance ids are scoped ``{tenant_id}:{session_id}:{uuid}`` so logs show ownership."""
    return f"{tenant_id}:{session_id or 'oneshot'}:{uuid.uuid4().hex}"


def split_instance_id(instance_id: str) -> tuple[str, str, str]:
    parts = instance_id.split(":")
    if len(parts) < 3:
        return ("", "", instance_id)
    return (parts[0], ":".join(parts[1:-1]), parts[-1])


@dataclass
class SandboxInstance:
    instance_id: str
    provider: str
    status: str  # running, stopped, error
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Artifact:
    """A file produced by a run. Bytes come inline (one-shot runs) or through ``fetch``."""

    name: str
    mime_type: str
    size: int
    sha256: str
    path: str = ""
    _data: bytes | None = field(default=None, repr=False, compare=False)
    _fetcher: Callable[[str], bytes] | None = field(default=None, repr=False, compare=False)

    def read_bytes(self) -> bytes:
        """The artifact's content, checked against its sha256."""
        if self._data is None:
            if self._fetcher is None:
                raise InvalidConfigError(
                    f"artifact {self.name!r} has no content attached and its instance is gone",
                    details={"artifact": self.name},
                )
            self._data = self._fetcher(self.path or self.name)
        if hashlib.sha256(self._data).hexdigest() != self.sha256:
            raise InvalidConfigError(
                f"artifact {self.name!r} changed since the run (sha256 mismatch)",
                details={"artifact": self.name},
            )
        return self._data

    fetch = read_bytes

    @property
    def has_content(self) -> bool:
        return self._data is not None

    def to_dict(self, include_content: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "mime_type": self.mime_type,
            "size": self.size,
            "sha256": self.sha256,
            "path": self.path,
        }
        if include_content and self._data is not None:
            out["content_b64"] = base64.b64encode(self._data).decode()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], fetcher: Callable[[str], bytes] | None = None) -> Artifact:
        data = base64.b64decode(d["content_b64"]) if d.get("content_b64") is not None else None
        return cls(
            name=d["name"],
            mime_type=d.get("mime_type", "application/octet-stream"),
            size=int(d.get("size", len(data) if data is not None else 0)),
            sha256=d.get("sha256") or (hashlib.sha256(data).hexdigest() if data is not None else ""),
            path=d.get("path", d["name"]),
            _data=data,
            _fetcher=fetcher,
        )


@dataclass
class ExecutionResult:
    stdout: str
    stderr: str
    exit_code: int
    execution_time: float
    metadata: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    truncated: bool = False
    result: Any = None
    artifacts: list[Artifact] = field(default_factory=list)
    error: dict[str, str] | None = None
    """The exception that ended the user's Python or JavaScript code, as E2B's SDK and Jupyter
    give it: ``{"name": "ZeroDivisionError", "value": "division by zero", "traceback": <the text
    printed on stderr>}``. None when the code raised nothing (a SyntaxError counts, ``sys.exit``
    does not), for bash (its exit code says it), and where the backend does not report it
    (RAGFlow's ``/run``). Not ``error_code``: that is execbox's own SB005/SB006 for the run."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.error_code

    @property
    def error_code(self) -> str | None:
        """SB005 (timeout), SB006 (out of memory) or None; the result still holds partial output."""
        return self.metadata.get("error_code")

    @property
    def result_present(self) -> bool:
        return bool(self.metadata.get("result_present", self.result is not None))

    def raise_for_status(self) -> ExecutionResult:
        """Raise the SB error this result carries (timeout, OOM); return self otherwise."""
        from .errors import ERRORS_BY_CODE

        code = self.error_code
        if code:
            cls = ERRORS_BY_CODE[code]
            raise cls(self.metadata.get("error_message", code), details={"result": self.to_dict()})
        return self

    def to_dict(self, include_artifact_content: bool = False) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exit_code": self.exit_code,
            "execution_time": self.execution_time,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "result": self.result,
            "artifacts": [a.to_dict(include_artifact_content) for a in self.artifacts],
            "error": dict(self.error) if self.error is not None else None,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], fetcher: Callable[[str], bytes] | None = None) -> ExecutionResult:
        return cls(
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            exit_code=int(d.get("exit_code", 0)),
            execution_time=float(d.get("execution_time", 0.0)),
            metadata=dict(d.get("metadata") or {}),
            timed_out=bool(d.get("timed_out", False)),
            truncated=bool(d.get("truncated", False)),
            result=d.get("result"),
            artifacts=[Artifact.from_dict(a, fetcher) for a in d.get("artifacts") or []],
            error=execution_error(d.get("error")),
        )


EXECUTION_ERROR_KEYS = ("name", "value", "traceback")


def execution_error(value: Any) -> dict[str, str] | None:
    """``ExecutionResult.error`` from its JSON: ``{name, value, traceback}`` (each a string; a
    missing one is ""), or None. Anything else (a field of another type) is a ValueError."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError("error must be null or an object with a string name")
    out = {"name": value["name"]}
    for key in EXECUTION_ERROR_KEYS[1:]:
        text = value.get(key, "")
        if not isinstance(text, str):
            raise ValueError(f"error.{key} must be a string")
        out[key] = text
    return out


@dataclass
class FileInfo:
    path: str
    size: int
    is_dir: bool
    modified: float
    symlink_target: str | None = None
    """A symlink's own text (never followed: size and modified are the link's); None otherwise, and
    for a link whose text is not valid UTF-8 (``kind`` says ``symlink``)."""
    kind: str | None = None
    """What the entry is (lstat): ``file`` (regular), ``dir``, ``symlink``, ``fifo``, ``socket``,
    ``device`` or ``other``; None where the provider does not say (an older box agent). Not in the
    HTTP API's replies (their schema is unchanged)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TextPage:
    """A page of a text file: lines ``offset`` .. ``offset+len(lines)`` of ``total_lines``."""

    path: str
    content: str
    offset: int
    limit: int
    total_lines: int
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GrepMatch:
    path: str
    line_number: int
    line: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GrepResult(list[GrepMatch]):
    """A grep's matches (a list, as before), and what the search says about them.

    ``truncated``: more lines matched than ``max_results`` (narrow the pattern or ask for more);
    ``binary_matches``: binary files (a NUL byte in their first 8 KiB) that match, their lines not
    returned (GNU grep's "Binary file X matches"; they count toward ``max_results``); ``skipped``:
    ``{path, reason}`` of files not searched, or only in part (``unreadable``, ``not_regular``,
    ``long_line``: a line over 8 MiB searched in pieces); ``skipped_names``: names not valid UTF-8
    left out of the walk."""

    def __init__(self, matches: Iterable[GrepMatch] = (), *, truncated: bool = False,
                 binary_matches: Iterable[str] = (), skipped: Iterable[dict[str, str]] = (),
                 skipped_names: int = 0) -> None:
        super().__init__(matches)
        self.truncated = truncated
        self.binary_matches = list(binary_matches)
        self.skipped = [dict(s) for s in skipped]
        self.skipped_names = skipped_names

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GrepResult:
        """From a grep reply (the agent's or the HTTP API's): only ``matches`` is required."""
        return cls([GrepMatch(**m) for m in d["matches"]], truncated=bool(d.get("truncated", False)),
                   binary_matches=[str(p) for p in d.get("binary_matches") or []],
                   skipped=[{"path": str(s["path"]), "reason": str(s["reason"])} for s in d.get("skipped") or []],
                   skipped_names=int(d.get("skipped_names") or 0))

    def to_dict(self) -> dict[str, Any]:
        """The HTTP API's grep reply."""
        return {"matches": [m.to_dict() for m in self], "truncated": self.truncated,
                "binary_matches": list(self.binary_matches), "skipped": [dict(s) for s in self.skipped],
                "skipped_names": self.skipped_names}


class GlobResult(list[str]):
    """A glob's paths (a list, as before); ``truncated`` when more matched than ``max_results``,
    ``skipped_names``: names not valid UTF-8 left out."""

    def __init__(self, paths: Iterable[str] = (), *, truncated: bool = False, skipped_names: int = 0) -> None:
        super().__init__(paths)
        self.truncated = truncated
        self.skipped_names = skipped_names

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GlobResult:
        paths = d["paths"]
        if not all(isinstance(p, str) for p in paths):
            raise TypeError("a path is not a string")
        return cls(paths, truncated=bool(d.get("truncated", False)), skipped_names=int(d.get("skipped_names") or 0))

    def to_dict(self) -> dict[str, Any]:
        return {"paths": list(self), "truncated": self.truncated, "skipped_names": self.skipped_names}


class FileBytes(bytes):
    """A file's bytes, or the range of them a read asked for (``offset``), with the file's whole
    size (``total_size``): a file larger than one read (64 MiB) is fetched in pieces."""

    offset: int
    total_size: int

    def __new__(cls, data: bytes = b"", offset: int = 0, total_size: int | None = None) -> FileBytes:
        self = super().__new__(cls, data)
        self.offset = offset
        self.total_size = len(data) + offset if total_size is None else total_size
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FileBytes, (bytes(self), self.offset, self.total_size))
