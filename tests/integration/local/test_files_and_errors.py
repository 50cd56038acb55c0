"""Workspace file operations and every SB error path reachable through the local provider."""

import os
import signal

import pytest

from execbox import Sandbox
from execbox.errors import (
    CodeBlockedError,
    FileNotFoundInSandbox,
    InstanceCreationError,
    InvalidConfigError,
    NotTextError,
    PathError,
    ProviderNotInitializedError,
    ProviderUnavailableError,
    RateLimitError,
    SessionNotFoundError,
)
from execbox.providers.local import LocalProvider

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sb(local_sandbox):
    return local_sandbox


def test_write_read_list_glob_grep(sb):
    sb.files.write("src/app.py", "import os\nprint('hi')\n")
    sb.files.write("src/lib/util.py", "def helper():\n    return 'hi'\n")
    sb.files.write("data.bin", b"\x00\x01\x02")
    page = sb.files.read("src/app.py", offset=1, limit=1)
    assert page.content == "print('hi')\n" and page.total_lines == 2 and page.truncated is False
    assert sb.files.read_bytes("data.bin") == b"\x00\x01\x02"
    names = {f.path for f in sb.files.list("src")}
    assert names == {"src/app.py", "src/lib"}
    assert sorted(sb.files.glob("**/*.py")) == ["src/app.py", "src/lib/util.py"]
    assert sb.files.glob("*.py") == []
    hits = sb.files.grep("hi", glob="*.py")
    assert {(m.path, m.line_number) for m in hits} == {("src/app.py", 2), ("src/lib/util.py", 2)}
    assert sb.run_code("print(open('src/lib/util.py').read().count('hi'))").stdout == "1\n"


def test_paged_read_of_long_file(sb):
    sb.files.write("long.txt", "".join(f"line {i}\n" for i in range(100)))
    page = sb.files.read("long.txt", offset=10, limit=5)
    assert page.content.splitlines() == [f"line {i}" for i in range(10, 15)]
    assert page.truncated and page.total_lines == 100


def test_sdk_results_carry_truncation_ranges_and_a_binary_read_names_read_bytes(sb):
    """Review 29 (2, 3, 11): what the agent reports reaches the in-process SDK too."""
    sb.files.write_many({f"d/{i}.txt": "hit\n" for i in range(4)} | {"blob.bin": b"\x00hit"})
    hits = sb.files.grep("hit", "d", max_results=2)
    assert len(hits) == 2 and hits.truncated is True
    assert sb.files.grep("hit", glob="*.bin").binary_matches == ["blob.bin"]
    paths = sb.files.glob("d/*", max_results=3)
    assert paths == ["d/0.txt", "d/1.txt", "d/2.txt"] and paths.truncated is True
    piece = sb.files.read_bytes("d/0.txt", offset=1, length=2)
    assert piece == b"it" and piece.offset == 1 and piece.total_size == 4
    with pytest.raises(NotTextError) as e:
        sb.files.read("blob.bin")
    assert "files.read_bytes('blob.bin')" in e.value.message and isinstance(e.value, InvalidConfigError)


def test_mkdir_move_and_delete(sb):
    assert sb.files.mkdir("m/n") is True and sb.files.mkdir("m") is False
    sb.files.write("m/n/f.txt", "f")
    assert sb.files.move("m/n/f.txt", "g.txt") == "g.txt"
    sb.files.delete("m")
    assert sb.files.read("g.txt").content == "f" and sb.files.glob("m*") == []
    with pytest.raises(PathError):
        sb.files.move("g.txt", "../out.txt")


def test_append_and_create_modes(sb):
    sb.files.write("log.txt", "a\n")
    sb.files.write("log.txt", "b\n", mode="append")
    assert sb.files.read("log.txt").content == "a\nb\n"
    with pytest.raises(InvalidConfigError) as ei:
        sb.files.write("log.txt", "c", mode="create")
    assert ei.value.http_status == 409
    with pytest.raises(InvalidConfigError):
        sb.files.write("log.txt", "c", mode="truncate-everything")


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b", "nul\x00byte"])
def test_file_api_rejects_bad_paths(sb, path):
    for op in (lambda: sb.files.write(path, "x"), lambda: sb.files.read(path), lambda: sb.files.list(path)):
        with pytest.raises(InvalidConfigError) as ei:
            op()
        assert ei.value.code == "SB002" and ei.value.http_status == 400


def test_file_api_refuses_symlink_made_by_code(sb, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret")
    sb.run_code(f"import os\nos.symlink({str(outside)!r}, 'link.txt')\nos.symlink({str(tmp_path)!r}, 'dir')")
    with pytest.raises(InvalidConfigError) as ei:
        sb.files.read("link.txt")
    assert "outside the workspace" in ei.value.message
    with pytest.raises(InvalidConfigError):
        sb.files.write("dir/planted.txt", "x")
    assert not (tmp_path / "planted.txt").exists()
    assert outside.read_text() == "host secret"


def test_missing_file_is_404(sb):
    with pytest.raises(FileNotFoundInSandbox) as ei:
        sb.files.read("nope.txt")
    assert ei.value.http_status == 404


def test_failed_write_keeps_old_file(sb):
    sb.files.write("keep.txt", "original")
    with pytest.raises(InvalidConfigError):
        sb.provider._call(sb.provider._get(sb.instance_id), "files.write",
                          {"path": "keep.txt", "content_b64": "!!!not base64!!!"})
    assert sb.files.read("keep.txt").content == "original"
    assert [f.path for f in sb.files.list(".") if f.path.startswith(".execbox")] == []


def test_write_many_is_all_or_nothing(sb):
    sb.files.write("a.txt", "old a")
    with pytest.raises(InvalidConfigError):
        sb.files.write_many({"a.txt": "new a", "b.txt": "new b", "../evil.txt": "x"})
    assert sb.files.read("a.txt").content == "old a"
    with pytest.raises(FileNotFoundInSandbox):
        sb.files.read("b.txt")
    infos = sb.files.write_many({"a.txt": "new a", "dir/b.txt": "new b"})
    assert {i.path for i in infos} == {"a.txt", "dir/b.txt"}
    assert sb.files.read("dir/b.txt").content == "new b"


def test_grep_bad_regex_is_sb002(sb):
    with pytest.raises(InvalidConfigError) as ei:
        sb.files.grep("([")
    assert ei.value.details.get("field") == "pattern"


def test_run_command_cwd_and_env(sb):
    sb.files.write("sub/x.txt", "x")
    r = sb.run_command("pwd; ls; echo $GREETING", cwd="sub", env={"GREETING": "hey"})
    assert r.stdout.splitlines()[1:] == ["x.txt", "hey"]
    with pytest.raises(InvalidConfigError):
        sb.run_command("ls", cwd="../..")


def test_environment_is_built_from_scratch(sb, monkeypatch):
    monkeypatch.setenv("EXECBOX_TEST_SECRET", "leak-me")
    r = sb.run_code("import os\nprint(sorted(os.environ))")
    assert "EXECBOX_TEST_SECRET" not in r.stdout
    assert "leak-me" not in sb.run_command("env").stdout


# -- SB error paths --------------------------------------------------------------------------

def test_sb001_uninitialized_provider():
    with pytest.raises(ProviderNotInitializedError) as ei:
        LocalProvider().create_instance()
    assert ei.value.code == "SB001"


def test_sb002_bad_config():
    with pytest.raises(InvalidConfigError) as ei:
        LocalProvider().initialize({"timeout": 0, "max_memory": "lots", "bogus": 1})
    assert set(ei.value.details["fields"]) == {"timeout", "max_memory", "bogus"}
    with pytest.raises(InvalidConfigError) as ei:
        LocalProvider().initialize({"python": "/nonexistent/python"})
    assert "not an executable" in ei.value.message


def test_sb002_bad_timeout_argument(sb):
    for bad in (0, -1, "10", True):
        with pytest.raises(InvalidConfigError):
            sb.run_code("print(1)", timeout=bad)


def test_sb004_box_cannot_start(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    p = LocalProvider()
    p.initialize({"python": str(fake)})
    try:
        with pytest.raises(InstanceCreationError) as ei:
            p.create_instance()
        assert ei.value.code == "SB004" and "agent" in ei.value.message
    finally:
        p.shutdown()


def test_sb005_raise_for_status(sb):
    from execbox.errors import ExecutionTimeoutError

    r = sb.run_code("import time; time.sleep(5)", timeout=0.5)
    with pytest.raises(ExecutionTimeoutError):
        r.raise_for_status()


def test_sb007_policy_blocks_before_running():
    p = LocalProvider()
    p.initialize({"enable_ast_analysis": True})
    try:
        with Sandbox.create(p) as s:
            with pytest.raises(CodeBlockedError) as ei:
                s.run_code("print('ran')\nimport subprocess")
            assert ei.value.details["line"] == 2
            assert s.run_code("lst=[1]\nlst.remove(1)\nprint(lst)").stdout == "[]\n"
            assert s.run_code("import subprocess", "bash").exit_code != 0  # policy is Python-only
    finally:
        p.shutdown()


def test_sb008_too_many_contexts(sb):
    for i in range(16):
        sb.run_code("x = 1", context_id=f"c{i}")
    with pytest.raises(RateLimitError) as ei:
        sb.run_code("x = 1", context_id="one-too-many")
    assert ei.value.http_status == 429


def test_sb009_box_killed(local_provider):
    inst = local_provider.create_instance()
    box = local_provider._instances[inst.instance_id].box
    os.kill(box.proc.pid, signal.SIGKILL)
    box.proc.wait()
    with pytest.raises(ProviderUnavailableError) as ei:
        local_provider.execute_code(inst.instance_id, "print(1)", "python", 5)
    assert ei.value.code == "SB009" and ei.value.details["box_died"] is True
    with pytest.raises(SessionNotFoundError):
        local_provider.execute_code("default:x:nope", "print(1)", "python", 5)


def test_destroy_removes_workspace(local_provider):
    inst = local_provider.create_instance()
    ws = local_provider._instances[inst.instance_id].box.workspace
    assert os.path.isdir(ws)
    assert local_provider.destroy_instance(inst.instance_id) is True
    assert not os.path.exists(ws)
    assert local_provider.destroy_instance(inst.instance_id) is False


def test_warm_pool_hands_out_fresh_boxes():
    p = LocalProvider()
    p.initialize({"pool_size": 2})
    try:
        import time

        deadline = time.monotonic() + 30
        while p.pool_status()["ready"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        a = p.create_instance()
        assert a.metadata["from_pool"] is True
        p.execute_code(a.instance_id, "open('mine.txt','w').write('a')", "python", 5)
        p.destroy_instance(a.instance_id)
        b = p.create_instance()
        r = p.execute_code(b.instance_id, "import os; print(os.path.exists('mine.txt'))", "python", 5)
        assert r.stdout == "False\n"
        assert a.metadata["agent_pid"] != b.metadata["agent_pid"]
        p.destroy_instance(b.instance_id)
    finally:
        p.shutdown()


@pytest.mark.parametrize("call", [
    lambda sb: sb.files.glob("../*"),
    lambda sb: sb.files.glob("/etc/*"),
    lambda sb: sb.files.grep("x", glob="../*.py"),
])
def test_glob_patterns_are_validated_as_paths(sb, call):
    with pytest.raises(InvalidConfigError) as ei:
        call(sb)
    assert ei.value.code == "SB002" and ei.value.http_status == 400
