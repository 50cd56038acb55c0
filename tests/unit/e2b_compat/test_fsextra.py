"""The agent's mkdir/move operations (E2B files.make_dir / files.rename), attacked with paths that
try to leave the workspace."""

from __future__ import annotations

import os

import pytest

from execbox.agent import fileops, fsextra


def test_make_dir_and_move(tmp_path) -> None:  # noqa: ANN001
    ws = str(tmp_path)
    assert fsextra.make_dir(ws, "a/b") == {"created": True}
    assert fsextra.make_dir(ws, "a/b") == {"created": False}
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(fileops.FileOpError) as exists:
        fsextra.make_dir(ws, "f.txt")
    assert exists.value.status == 409
    assert fsextra.move(ws, "f.txt", "a/b/c/g.txt") == {"path": "a/b/c/g.txt"}
    assert (tmp_path / "a/b/c/g.txt").read_text() == "x"
    with pytest.raises(fileops.FileOpError) as missing:
        fsextra.move(ws, "nope", "x")
    assert missing.value.status == 404


@pytest.mark.parametrize(("op", "args"), [
    ("mkdir", ("../escape",)), ("mkdir", ("/tmp/escape",)), ("mkdir", ("link/inside",)),
    ("move", ("f.txt", "../f.txt")), ("move", ("f.txt", "link/f.txt")), ("move", ("../outside.txt", "in.txt")),
    ("move", (".", "elsewhere")),
])
def test_paths_cannot_leave_the_workspace(tmp_path, op: str, args: tuple[str, ...]) -> None:  # noqa: ANN001
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    (ws / "f.txt").write_text("x")
    os.symlink(outside, ws / "link")  # a symlink pointing out of the workspace
    with pytest.raises(fileops.FileOpError):
        fsextra.handle(str(ws), {"op": f"files.{op}", **dict(zip(
            ("path",) if op == "mkdir" else ("source", "destination"), args, strict=True))})
    assert list(outside.iterdir()) == [] and (tmp_path / "outside.txt").read_text() == "secret"
    assert not (tmp_path / "escape").exists() and not os.path.exists("/tmp/escape")
