import os

import pytest

from execbox.agent import paths


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    (w / "sub").mkdir(parents=True)
    (w / "sub" / "f.txt").write_text("x")
    (tmp_path / "secret.txt").write_text("s")
    return str(w)


@pytest.mark.parametrize("bad,reason", [
    ("/etc/passwd", "absolute"),
    ("../secret.txt", "'..'"),
    ("sub/../../secret.txt", "'..'"),
    ("a\x00b", "NUL"),
    ("\\windows", "absolute"),
    ("C:/x", "absolute"),
])
def test_rejected(ws, bad, reason):
    with pytest.raises(paths.PathViolation) as ei:
        paths.resolve(ws, bad)
    assert reason in ei.value.reason


def test_allowed_and_normalised(ws):
    assert paths.check_syntax("./sub//f.txt") == "sub/f.txt"
    assert paths.resolve(ws, "sub/f.txt") == os.path.join(os.path.realpath(ws), "sub", "f.txt")
    assert paths.resolve(ws, ".") == os.path.realpath(ws)
    assert paths.resolve(ws, "new/file.txt").startswith(os.path.realpath(ws))


def test_symlink_escape_is_refused(ws, tmp_path):
    os.symlink(str(tmp_path / "secret.txt"), os.path.join(ws, "link"))
    os.symlink(str(tmp_path), os.path.join(ws, "dirlink"))
    os.symlink("/", os.path.join(ws, "root"))
    for p in ("link", "dirlink/secret.txt", "dirlink/newfile", "root/etc/shadow"):
        with pytest.raises(paths.PathViolation) as ei:
            paths.resolve(ws, p)
        assert "outside" in ei.value.reason


def test_symlink_inside_is_fine(ws):
    os.symlink("sub/f.txt", os.path.join(ws, "inner"))
    assert paths.resolve(ws, "inner").endswith("sub/f.txt")


def test_overlong_path(ws):
    with pytest.raises(paths.PathViolation):
        paths.check_syntax("a/" * 3000)


def test_follow_false_checks_the_parent_only(ws, tmp_path):
    os.symlink(str(tmp_path / "secret.txt"), os.path.join(ws, "out"))
    os.symlink(str(tmp_path), os.path.join(ws, "dirlink"))
    root = os.path.realpath(ws)
    assert paths.resolve(ws, "out", follow=False) == os.path.join(root, "out")  # the link itself
    with pytest.raises(paths.PathViolation):
        paths.resolve(ws, "out")
    with pytest.raises(paths.PathViolation):  # the parent is still resolved and checked
        paths.resolve(ws, "dirlink/secret.txt", follow=False)


def test_name_and_path_length_limits(ws):
    assert paths.check_syntax("n" * 255) == "n" * 255
    for bad in ("n" * 256, "é" * 128):  # bytes, not characters
        with pytest.raises(paths.PathViolation) as ei:
            paths.check_syntax(bad)
        assert "255 bytes" in ei.value.reason and len(ei.value.path) < 100
    with pytest.raises(paths.PathViolation) as deep:
        paths.resolve(ws, "d/" * 2040 + "x")
    assert "4096 bytes" in deep.value.reason
