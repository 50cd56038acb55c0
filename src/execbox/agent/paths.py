"""The one path validator: every workspace path from a user goes through ``resolve``.

Rules: relative only, no NUL, no ``..`` component, and after resolving symlinks the result must
stay inside the workspace. Stdlib only (runs inside boxes; the host imports it for early checks).
"""

from __future__ import annotations

import os

MAX_PATH_LEN = 4096
NAME_MAX = 255  # bytes in one path component (Linux, every file system a box uses)
PATH_MAX = 4096  # bytes in an absolute path the kernel accepts, its NUL included


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
        raise PathViolation(_clip(path), f"longer than {MAX_PATH_LEN} characters")
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        raise PathViolation(path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathViolation(path, "'..' components are not allowed")
    for p in parts:
        try:
            size = len(os.fsencode(p))
        except UnicodeError:
            raise PathViolation(path, "path is not valid UTF-8") from None
        if size > NAME_MAX:
            raise PathViolation(_clip(path), f"a name in it is longer than {NAME_MAX} bytes")
    return "/".join(parts) or "."


def _clip(path: str) -> str:
    return path if len(path) <= 80 else path[:64] + "..."


def resolve(workspace: str, path: str, *, must_exist: bool = False, follow: bool = True) -> str:
    """Absolute real path of ``path`` inside ``workspace``, following symlinks, or PathViolation.

    A path whose final component does not exist yet is resolved through its parent, so a write
    cannot create a file through a symlinked directory that points outside. With ``follow=False``
    only the parent directory is resolved and checked, and the last component is kept as it is
    (remove and rename act on a symlink itself, never on what it points to, as ``rm`` and
    ``mv`` do): the caller must then never open the result, only lstat, unlink or rename it.
    """
    rel = check_syntax(path)
    root = os.path.realpath(workspace)
    if follow or rel == ".":
        real = os.path.realpath(os.path.join(root, rel))
        inside = real
    else:
        head, name = os.path.split(rel)
        inside = os.path.realpath(os.path.join(root, head))
        real = os.path.join(inside, name)
    if inside != root and not inside.startswith(root + os.sep):
        raise PathViolation(path, "resolves outside the workspace (symlink escape)")
    if len(os.fsencode(real)) >= PATH_MAX:
        raise PathViolation(_clip(path), f"longer than {PATH_MAX} bytes once inside the workspace")
    if must_exist and not os.path.lexists(real):
        raise FileNotFoundError(path)
    return real


def relative(workspace: str, real: str) -> str:
    root = os.path.realpath(workspace)
    return os.path.relpath(real, root)
