"""The one path validator: every workspace path from a user goes through ``resolve``.

Rules: relative only, no NUL, no ``..`` component, valid UTF-8, and after resolving symlinks the
result must stay inside the workspace (and still be valid UTF-8). Stdlib only (runs inside boxes;
the host imports it for early checks).

Names are UTF-8 because the protocol is UTF-8 JSON: a name the file system holds as other bytes
(``os.listdir`` gives them as lone surrogates) has no form a reply can carry or a request can name.
Listings, searches and artifacts leave such names out and count them (``Skipped``).
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
        raise PathViolation(path, "NUL byte in path")  # repr shows it as \x00
    if not is_utf8(path):  # os.fsencode would turn '\udcff' into the byte 0xff: a name no reply can show
        raise PathViolation(path.encode("utf-8", "backslashreplace").decode(), "path is not valid UTF-8")
    if len(path) > MAX_PATH_LEN:
        raise PathViolation(_clip(path), f"longer than {MAX_PATH_LEN} characters")
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        raise PathViolation(path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathViolation(path, "'..' components are not allowed")
    for p in parts:
        if len(p.encode("utf-8")) > NAME_MAX:
            raise PathViolation(_clip(path), f"a name in it is longer than {NAME_MAX} bytes")
    return "/".join(parts) or "."


def names_directory(path: str) -> bool:
    """Whether ``path`` names a directory by its form: its last component is empty (it ends in
    ``/``), ``.`` (``d/.``) or ``..`` (``d/x/..``, which the validator refuses anyway but a caller
    that normalises first would not), ``\\`` counting as a separator as in ``check_syntax``.

    open(2) refuses such a path for a file (EISDIR), and rename(2) to it unless it is a directory
    (ENOTDIR); the path validator drops those components, so a write or a move's destination that
    did not ask first would make a file ``d`` for ``d/``. Reads, listings and mkdir accept it."""
    if not isinstance(path, str):
        return False
    return path.replace("\\", "/").rsplit("/", 1)[-1] in ("", ".", "..")


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
    if not is_utf8(real):  # a symlink to a name in other bytes: its listing would carry that name
        raise PathViolation(path, "resolves to a name that is not valid UTF-8 (through a symlink)")
    if len(os.fsencode(real)) >= PATH_MAX:
        raise PathViolation(_clip(path), f"longer than {PATH_MAX} bytes once inside the workspace")
    if must_exist and not os.path.lexists(real):
        raise FileNotFoundError(path)
    return real


def relative(workspace: str, real: str) -> str:
    root = os.path.realpath(workspace)
    return os.path.relpath(real, root)


def is_utf8(name: str) -> bool:
    """Whether ``name`` has a UTF-8 form (a name ``os.listdir`` decoded from other bytes has none)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Skipped:
    """Tally of names left out of a listing, search or artifact scan for not being valid UTF-8."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def keep(self, names: list[str]) -> list[str]:
        """The UTF-8 ones of ``names``; the others are counted."""
        good = [n for n in names if is_utf8(n)]
        self.count += len(names) - len(good)
        return good

    def reply(self) -> dict[str, int]:
        """``{"skipped_names": n}`` for a reply when any were left out, else nothing."""
        return {"skipped_names": self.count} if self.count else {}
