"""E2B paths <-> workspace paths, and the sandbox a sandbox-URL request addresses.

E2B programs see the user's home, ``/home/user``; in execbox that is the session workspace.
Relative paths are relative to it, as in E2B. Paths elsewhere in the box's filesystem are not
reachable through the facade (the workspace is the only place the file API may touch); they get
an invalid-argument error that says so. The syntax check is the agent's one path validator, and
a write's refusal of a path that names a directory is its ``names_directory``.
"""

from __future__ import annotations

import posixpath

from ...agent.paths import PathViolation, check_syntax, names_directory
from ...errors import InvalidConfigError
from .sandbox_http import clip

HOME = "/home/user"


class PathRefused(ValueError):
    """A path outside the workspace, or one the agent's validator rejects."""


def to_workspace(path: str, *, write: bool = False) -> str:
    """The workspace path of an E2B path (normalised: ``d/``, ``d/.`` and ``/home/user/d/`` are ``d``).

    With ``write`` (a file is to be written there) a path that names a directory by its form
    (``paths.names_directory``: it ends in ``/`` or ``/.``) is refused first, as envd's open(2)
    refuses it with EISDIR: an SB002 InvalidConfigError naming the path, the error a write the
    agent refuses gets, so nothing is written (normalising would make it a file ``d``). Reads,
    listings and mkdir take such a path as the directory it names."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise PathRefused("path must be a non-empty string")
    if write and names_directory(path):
        raise InvalidConfigError(f"cannot write {clip(path)!r}: a path ending in '/' or '/.' names a directory; "
                                 "name the file", details={"field": "path", "path": clip(path)})
    p = path
    if p == "~" or p.startswith("~/"):
        p = HOME + p[1:]
    if p.startswith("/"):
        p = posixpath.normpath(p)
        if p == HOME:
            return "."
        if not p.startswith(HOME + "/"):
            raise PathRefused(f"{clip(path)!r} is outside {HOME}; execbox's E2B endpoint reaches only the "
                              f"workspace mounted at {HOME}")
        p = p[len(HOME) + 1:]
    p = posixpath.normpath(p)
    if p in ("", "."):
        return "."
    try:
        check_syntax(p)
    except PathViolation as e:
        raise PathRefused(str(e)) from None
    return p


def to_e2b(rel: str) -> str:
    rel = posixpath.normpath(rel or ".")
    return HOME if rel == "." else f"{HOME}/{rel}"
