"""resources/list offers only what resources/read can read (mcp/resource_list.py, review 42 finding 7):
a symlink is listed only when its chain of links ends at a regular file inside the workspace (with
that file's size); one leading outside (absolute, `..` past the root, through another link that
does), to a directory, to nothing, or round a loop is left out, as are directories."""

from __future__ import annotations

from execbox.mcp.resource_list import iter_readable
from execbox.models import FileInfo


def _f(path: str, size: int = 1, target: str | None = None, is_dir: bool = False) -> FileInfo:
    return FileInfo(path, size, is_dir, 0.0, target)


def test_only_links_that_end_at_a_file_inside_are_offered() -> None:
    entries = [
        _f("README", 11), _f("sub", 0, is_dir=True), _f("sub/f.txt", 7),
        _f("ok", 6, "README"),                    # a file beside it
        _f("sub/back", 6, "../README"),           # `..` that stays inside
        _f("dirlink", 3, "sub"), _f("via", 10, "dirlink/f.txt"),  # through a link to a directory
        _f("chain", 2, "ok"),                     # a link to a link to a file
        _f("pw", 11, "/etc/passwd"),              # absolute: outside
        _f("up", 2, ".."),                        # the workspace's parent
        _f("sub/out", 9, "../../x"),              # `..` past the root
        _f("esc", 7, "dirlink/../../etc"),        # past the root through a link
        _f("abslink", 4, "/"), _f("viaabs", 11, "abslink/etc/passwd"),
        _f("loop1", 5, "loop2"), _f("loop2", 5, "loop1"),
        _f("dangling", 4, "nothing"),
        _f("todir", 3, "sub"),                    # a directory: a read of it fails
        _f("self", 4, "self"),
    ]
    offered = list(iter_readable(entries))
    assert [(e.path, e.size) for e in offered] == [
        ("README", 11), ("sub/f.txt", 7), ("ok", 11), ("sub/back", 11), ("via", 7), ("chain", 11)]
    assert offered[2].symlink_target == "README"  # still shown as the link it is


def test_a_plain_listing_is_unchanged_but_for_directories() -> None:
    entries = [_f("a.txt", 3), _f("d", 0, is_dir=True), _f("d/b.bin", 9)]
    assert list(iter_readable(entries)) == [entries[0], entries[2]]
