"""The one path validator: every workspace path from a user goes through ``resolve``.

Rules: relative only, no NUL, no ``..`` component, and after resolving symlinks the result must
stay inside the workspace. Stdlib only (runs inside boxes; the host imports it for early checks).
"""

from __future__ import annotations

import os

MAX_PATH_LEN = 4096


class PathViolation(ValueError):
    """Raised with a message that names the rule the path broke."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"invalid path {path!r}: {reason}")
        self.path = path
        self.reason = reason


def check_syntax(path: str) -> str:
    """Reject what no workspace path may contain; return the normalised relative form."""
    if not isinstance(path, str):
        raise PathViolation(repr(path), "path must be a string")
    if "\x00" in path:
        raise PathViolation(path.replace("\x00", "\\0"), "NUL byte in path")
    if len(path) > MAX_PATH_LEN:
        raise PathViolation(path[:64] + "...", f"longer than {MAX_PATH_LEN} characters")
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        raise PathViolation(path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathViolation(path, "'..' components are not allowed")
    return "/".join(parts) or "."


def resolve(workspace: str, path: str, *, must_exist: bool = False) -> str:
    """Absolute real path of ``path`` inside ``workspace``, following symlinks, or PathViolation.

    A path whose final component does not exist yet is resolved through its parent, so a write
    cannot create a file through a symlinked directory that points outside.
    """
    rel = check_syntax(path)
    root = os.path.realpath(workspace)
    real = os.path.realpath(os.path.join(root, rel))
    if real != root and not real.startswith(root + os.sep):
        raise PathViolation(path, "resolves outside the workspace (symlink escape)")
    if must_exist and not os.path.lexists(real):
        raise FileNotFoundError(path)
    return real


def relative(workspace: str, real: str) -> str:
    root = os.path.realpath(workspace)
    return os.path.relpath(real, root)
