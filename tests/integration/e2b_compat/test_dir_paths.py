"""Review 43 F5, the E2B facade: a write to a path that names a directory (``/home/user/d/``,
``d/``, ``~/d/``, ``d/.``) fails as envd's open(2) does (EISDIR), an SB002 naming the path, and
writes nothing; normalising it had written a file ``d``. Reads, lists and mkdir still take it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from execbox.errors import InvalidConfigError
from execbox.service.e2b_compat.workspace import to_workspace

from .conftest import Server, module_sandbox

e2b = pytest.importorskip("e2b")

DIR_FORMS = ["/home/user/d/", "d/", "~/d/", "d/.", "/home/user/d/.", "new/sub/", "d\\", "/home/user/d/x/.."]


@pytest.mark.parametrize("path", DIR_FORMS)
def test_to_workspace_refuses_a_directory_form_for_a_write_only(path: str) -> None:
    with pytest.raises(InvalidConfigError) as e:
        to_workspace(path, write=True)
    assert e.value.code == "SB002" and repr(path) in e.value.message
    to_workspace(path)  # a read, list or mkdir: the directory it names
    assert to_workspace("/home/user/d/") == "d" and to_workspace("d/x", write=True) == "d/x"


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: e2b.Sandbox.create(timeout=300, metadata={"suite": "dir-paths"})) as sb:
        yield sb


def _names(sb) -> set[str]:  # noqa: ANN001
    return {e.name for e in sb.files.list("/home/user")}


@pytest.mark.parametrize("path", ["/home/user/d/", "d/", "~/d/", "d/.", "/home/user/new/."])
def test_a_file_write_to_a_directory_form_fails_and_writes_nothing(sbx, path: str) -> None:
    before = _names(sbx)
    with pytest.raises(e2b.SandboxException) as e:
        sbx.files.write(path, "x")
    assert "SB002" in str(e.value) and "names a directory" in str(e.value) and path in str(e.value)
    assert _names(sbx) == before and "d" not in before and "new" not in before


def test_an_upload_to_a_directory_form_is_400_sb002(e2b_server: Server, sbx) -> None:
    """Both upload forms: octet-stream with ``path``, and multipart (a part's file name)."""
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": sbx._envd_access_token}
    url = f"{e2b_server.url}/files"
    raw = httpx.post(url, params={"path": "/home/user/up/"}, content=b"x", timeout=30,
                     headers={**base, "Content-Type": "application/octet-stream"})
    multi = httpx.post(url, files=[("file", ("up2/.", b"x"))], headers=base, timeout=30)
    for r, path in ((raw, "/home/user/up/"), (multi, "up2/.")):
        assert r.status_code == 400 and r.json()["message"].startswith("SB002: ") and repr(path) in r.text, r.text
    assert not {"up", "up2"} & _names(sbx)


def test_reads_lists_and_mkdir_take_a_trailing_slash(sbx) -> None:
    assert sbx.files.make_dir("/home/user/made/") is True
    sbx.files.write("/home/user/made/f.txt", "in")
    assert [e.name for e in sbx.files.list("made/")] == ["f.txt"]
    assert sbx.files.read("made/./f.txt") == "in"
    assert sbx.files.exists("~/made/")


def test_a_rename_to_a_directory_form_that_is_no_directory_fails_and_moves_nothing(sbx) -> None:
    """``files.rename(f, "m/")`` with no directory ``m``: refused as rename(2) would (ENOTDIR), not a
    rename to a file ``m`` (normalising dropped the slash); onto an existing directory, as without it."""
    sbx.files.write("/home/user/mv-src.txt", "data")
    for dest in ("/home/user/mv-to/", "mv-to/."):
        with pytest.raises(e2b.SandboxException) as e:
            sbx.files.rename("/home/user/mv-src.txt", dest)
        assert "names a directory" in str(e.value), e.value
    assert "mv-to" not in _names(sbx) and sbx.files.read("/home/user/mv-src.txt") == "data"
    sbx.files.make_dir("/home/user/mv-dir")
    for dest in ("/home/user/mv-dir/", "/home/user/mv-dir"):  # a file over a directory: refused either way
        with pytest.raises(e2b.SandboxException) as e:
            sbx.files.rename("/home/user/mv-src.txt", dest)
        assert "is a directory" in str(e.value), e.value
    sbx.files.rename("/home/user/mv-src.txt", "/home/user/mv-dir/in.txt")
    assert sbx.files.read("/home/user/mv-dir/in.txt") == "data"
