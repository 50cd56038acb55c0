"""Directory operations the E2B filesystem API needs: make a directory, move, remove.

Stdlib only, every path through ``paths.resolve`` (via fileops), never a shell command. Kept
apart from fileops so the gateway's file API and these facade needs evolve independently.
"""

from __future__ import annotations

import os

from . import fileops, paths

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any


def make_dir(ws: str, path: str) -> dict[str, Any]:
    """Create ``path`` and its parents; ``created`` is False when it already was a directory."""
    real = fileops._resolve(ws, path)
    if os.path.isdir(real):
        return {"created": False}
    if os.path.lexists(real):
        raise fileops.FileOpError(f"{path!r} exists and is not a directory", status=409, path=path)
    try:
        make_dirs(real)
    except OSError as e:
        raise fileops._os_error(e, path) from None
    return {"created": True}


def make_dirs(real: str) -> None:
    """``os.makedirs(real, exist_ok=True)`` as a loop: os.makedirs recurses once per missing
    parent, so a path ~1000 levels deep raised RecursionError. (How deep a path can go is
    bounded by its length: ``paths.resolve`` refuses one over PATH_MAX with 400.)"""
    missing = []
    head = real
    while not os.path.exists(head):
        parent, name = os.path.split(head)
        if not name or parent == head:
            break
        missing.append(name)
        head = parent
    for name in reversed(missing):
        head = os.path.join(head, name)
        try:
            os.mkdir(head)
        except FileExistsError:  # made meanwhile (as exist_ok allows), unless it is not a directory
            if not os.path.isdir(head):
                raise


def _fits_directory_form(src: str, dst: str) -> bool:
    """Whether ``dst``, written as a directory (``m/``), may be renamed to: a real directory there,
    or nothing there and ``src`` a real directory (rename(2) makes it ``m``)."""
    if os.path.islink(dst):
        return False
    if os.path.isdir(dst):
        return True
    return not os.path.lexists(dst) and os.path.isdir(src) and not os.path.islink(src)


def move(ws: str, source: str, destination: str) -> dict[str, Any]:
    """Rename ``source`` to ``destination`` (as ``mv``): a symlink at either end is the link
    itself, never what it points to, so a link pointing outside can be renamed but not followed.

    A destination that names a directory by its form (``m/``, ``m/.``: ``paths.names_directory``)
    must be one, or become one: a directory may be renamed to a missing ``m/`` (as rename(2) and
    ``mv`` do); a file to a missing ``m/``, or anything to a file or symlink ``m/``, is refused
    (ENOTDIR), never renamed to (or over) a file ``m``. Where it is a directory, the rename is tried
    as for ``m``."""
    src = fileops._resolve(ws, source, must_exist=True, follow=False)
    dst = fileops._resolve(ws, destination, follow=False)
    if src == os.path.realpath(ws):
        raise fileops.FileOpError("cannot move the workspace root", field="source")
    if dst == os.path.realpath(ws):
        raise fileops.FileOpError("cannot replace the workspace root", field="destination")
    if paths.names_directory(destination) and not _fits_directory_form(src, dst):
        raise fileops.FileOpError(f"cannot move to {destination!r}: a path ending in '/' or '/.' names a "
                                  "directory, and it is not one; name the new path without the '/'",
                                  field="destination", path=destination)
    parent = os.path.dirname(dst)
    try:
        make_dirs(parent)
        os.replace(src, dst)
    except OSError as e:
        raise fileops._os_error(e, destination) from None
    return {"path": paths.relative(ws, dst)}


def handle(ws: str, req: dict[str, Any]) -> dict[str, Any]:
    """Agent dispatch for files.mkdir / files.move (files.delete is fileops')."""
    op = req.get("op")
    if op == "files.mkdir":
        return make_dir(ws, req.get("path", ""))
    if op == "files.move":
        return move(ws, req.get("source", ""), req.get("destination", ""))
    raise fileops.FileOpError(f"unknown operation {op!r}", field="op")


OPS = ("files.mkdir", "files.move")
