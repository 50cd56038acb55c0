"""The official e2b / e2b-code-interpreter SDKs, unmodified, against a real `execbox serve`."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, module_sandbox

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    def create() -> object:
        return ci.Sandbox.create(timeout=300, metadata={"suite": "e2b-compat"}, envs={"GREETING": "hej"})

    with module_sandbox(e2b_server, create) as sandbox:
        yield sandbox


def test_run_code_python_stdout_value_and_state(sbx) -> None:
    seen: list[str] = []
    ex = sbx.run_code("x = 41\nprint('hello')\nx + 1", on_stdout=lambda m: seen.append(m.line))
    assert ex.logs.stdout == ["hello\n"] and seen == ["hello\n"]
    assert ex.text == "42" and ex.error is None
    assert sbx.run_code("x").text == "41"  # the default context keeps globals
    assert sbx.run_code("'a' * 3").text == "'aaa'"
    assert sbx.run_code("y = 1").results == []  # no trailing expression, no result


def test_cells_never_call_main_implicitly(sbx) -> None:
    ctx = sbx.create_code_context()
    assert sbx.run_code("def main():\n    print('called')\n    return 7", context=ctx).logs.stdout == []
    assert sbx.run_code("n = 5", context=ctx).logs.stdout == []  # the user's main stays uncalled
    ex = sbx.run_code("main() + n", context=ctx)
    assert ex.logs.stdout == ["called\n"] and ex.text == "12"
    sbx.remove_code_context(ctx)


def test_run_code_errors_and_execution_count(sbx) -> None:
    ex = sbx.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.error is not None
    assert (ex.error.name, ex.error.value) == ("ZeroDivisionError", "division by zero")
    assert "Traceback" in ex.error.traceback
    first = sbx.run_code("1").execution_count
    assert sbx.run_code("2").execution_count == first + 1


def test_run_code_matplotlib_png_and_html(sbx) -> None:
    import base64

    ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    ex = sbx.run_code("class T:\n    def _repr_html_(self):\n        return '<b>t</b>'\nT()")
    assert ex.results[0].html == "<b>t</b>" and ex.results[0].is_main_result


def test_run_code_javascript(sbx) -> None:
    ex = sbx.run_code("console.log('from node', 6 * 7)", language="javascript")
    assert ex.logs.stdout == ["from node 42\n"] and ex.error is None
    ex = sbx.run_code("throw new TypeError('bad thing')", language="js")
    assert ex.error is not None and ex.error.name == "TypeError" and "bad thing" in ex.error.value


def test_javascript_contexts_keep_state(sbx) -> None:
    sbx.run_code("var counter = 40; const double = (n) => n * 2", language="javascript")
    ex = sbx.run_code("counter += 1; double(counter)", language="javascript")
    assert ex.error is None and ex.text == "82"
    ctx = sbx.create_code_context(language="javascript")
    assert sbx.run_code("typeof counter", context=ctx).text == "undefined"  # contexts are separate
    sbx.run_code("globalThis.seen = await_me = 'x'", context=ctx)
    assert sbx.run_code("new Promise(r => setTimeout(() => r(seen + '!'), 20))", context=ctx).text == "x!"
    sbx.restart_code_context(ctx)
    assert sbx.run_code("typeof seen", context=ctx).text == "undefined"
    sbx.remove_code_context(ctx)


def test_code_contexts(sbx) -> None:
    ctx = sbx.create_code_context(language="python")
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.run_code("z = 'in ctx'", context=ctx)
    assert sbx.run_code("z", context=ctx).text == "'in ctx'"
    assert sbx.run_code("'z' in globals()").text == "False"  # the default context is separate
    sbx.restart_code_context(ctx)
    assert sbx.run_code("z", context=ctx).error.name == "NameError"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]


def test_commands_foreground_background_kill(sbx) -> None:
    r = sbx.commands.run("echo out; echo err >&2; echo $GREETING")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\nhej\n", "err\n", 0)
    with pytest.raises(e2b.CommandExitException) as failed:
        sbx.commands.run("exit 3")
    assert failed.value.exit_code == 3

    lines: list[str] = []
    got_two = threading.Event()

    def on_stdout(line: str) -> None:
        lines.append(line)
        if len(lines) >= 2:
            got_two.set()

    handle = sbx.commands.run("for i in $(seq 1 300); do echo tick $i; sleep 0.1; done", background=True)
    # the sync SDK delivers a background command's output to the callbacks given to wait()
    listener = threading.Thread(target=lambda: _wait_quietly(handle, on_stdout), daemon=True)
    listener.start()
    assert got_two.wait(30), lines
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    attached = sbx.commands.connect(handle.pid)  # a second listener on the same process
    assert attached.pid == handle.pid
    assert sbx.commands.kill(handle.pid) is True
    listener.join(30)
    assert not listener.is_alive()
    assert lines[0].startswith("tick 1") and len(lines) < 300
    assert sbx.commands.kill(handle.pid) is False  # gone
    assert sbx.commands.run("echo after").stdout == "after\n"  # the session is usable again


def test_stdin_send_and_close(sbx) -> None:
    handle = sbx.commands.run("read a; echo first:$a; cat; echo eof", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "one\n")
    sbx.commands.send_stdin(handle.pid, b"two\nthree\n")
    sbx.commands.close_stdin(handle.pid)  # EOF ends `cat`
    r = handle.wait()
    assert (r.stdout, r.exit_code) == ("first:one\ntwo\nthree\neof\n", 0)
    quiet = sbx.commands.run("sleep 20", background=True)  # stdin not asked for
    with pytest.raises(e2b.SandboxException):
        sbx.commands.send_stdin(quiet.pid, "x")
    assert sbx.commands.kill(quiet.pid) is True


def test_background_command_does_not_hold_the_sandbox(sbx) -> None:
    """While a background command streams and a cell runs, commands still run and output flows.

    The cell runs until a command releases it, so the test does not depend on how fast a loaded
    machine is."""
    lines: list[str] = []
    handle = sbx.commands.run("for i in $(seq 1 600); do echo beat $i; sleep 0.1; done", background=True)
    listener = threading.Thread(target=lambda: _wait_quietly(handle, lines.append), daemon=True)
    listener.start()
    cell: dict[str, object] = {}
    code = "import os, time\nwhile not os.path.exists('/tmp/release-cell'):\n    time.sleep(0.05)\n'released'"
    runner = threading.Thread(target=lambda: cell.setdefault("ex", sbx.run_code(code, timeout=120)), daemon=True)
    runner.start()
    try:
        time.sleep(0.5)
        seen_before = len(lines)
        r = sbx.commands.run("echo beside")  # a second process while the cell and the loop run
        assert r.stdout == "beside\n"
        assert runner.is_alive(), "the cell ended before it was released"
        deadline = time.monotonic() + 15
        while len(lines) <= seen_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(lines) > seen_before and runner.is_alive(), "background output stopped while the cell ran"
    finally:  # a failure here must not leave the module's sandbox busy with the cell
        sbx.commands.run("touch /tmp/release-cell")
    runner.join(60)
    assert cell["ex"].text == "'released'"
    assert sbx.commands.kill(handle.pid) is True
    listener.join(30)


def test_files_work_while_a_cell_runs(sbx) -> None:
    """As with E2B's envd, the filesystem does not wait for the code interpreter: a cell waiting
    for a file is released by a file written through the SDK."""
    sbx.files.write("progress.txt", "step 1")
    code = "import os, time\nwhile not os.path.exists('go.txt'):\n    time.sleep(0.05)\nopen('go.txt').read()"
    cell: dict[str, object] = {}
    runner = threading.Thread(target=lambda: cell.setdefault("ex", sbx.run_code(code, timeout=120)), daemon=True)
    runner.start()
    try:
        time.sleep(0.5)
        assert runner.is_alive(), "the cell ended before it was released"
        started = time.monotonic()
        assert sbx.files.read("progress.txt") == "step 1"
        assert "progress.txt" in [e.name for e in sbx.files.list("/home/user")]
        assert runner.is_alive() and time.monotonic() - started < 30  # the reads did not wait for the cell
        sbx.files.write("go.txt", "released by the sdk")
    finally:
        sbx.commands.run("touch go.txt")  # whatever happened above, the cell must not hold the sandbox
    runner.join(60)
    assert cell["ex"].text == "'released by the sdk'"


def test_pty_create_input_resize_exit(sbx) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    term = sbx.pty.create(PtySize(rows=30, cols=100), timeout=60)
    sbx.pty.send_stdin(term.pid, b"stty size; tty\n")
    sbx.pty.resize(term.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(term.pid, b"sleep 0.2; stty size; exit 7\n")
    chunks: list[bytes] = []
    with pytest.raises(e2b.CommandExitException) as ended:
        term.wait(on_pty=chunks.append)
    text = b"".join(chunks).decode(errors="replace")
    assert ended.value.exit_code == 7
    assert "/dev/pts/" in text and "40 120" in text, text


def test_command_timeout_ends_the_run(sbx) -> None:
    started = time.monotonic()
    with pytest.raises((e2b.TimeoutException, e2b.CommandExitException)):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 15
    assert sbx.commands.run("echo free").stdout == "free\n"  # the box was not left busy


def _wait_quietly(handle, on_stdout) -> None:
    try:
        handle.wait(on_stdout=on_stdout)
    except Exception:  # noqa: BLE001 - a killed command raises CommandExitException
        pass


def test_files_roundtrip_binary_list_remove(sbx) -> None:
    blob = bytes(range(256)) * 64
    info = sbx.files.write("/home/user/data/blob.bin", blob)
    assert info.path == "/home/user/data/blob.bin"
    assert bytes(sbx.files.read("data/blob.bin", format="bytes")) == blob
    sbx.files.write("notes.txt", "hello e2b")
    assert sbx.files.read("/home/user/notes.txt") == "hello e2b"
    names = {e.name: e.type for e in sbx.files.list("/home/user")}
    assert names["notes.txt"] == e2b.FileType.FILE and names["data"] == e2b.FileType.DIR
    assert sbx.files.exists("notes.txt") and sbx.files.get_info("data/blob.bin").size == len(blob)
    written = sbx.files.write_files([{"path": "many/a.txt", "data": "A"}, {"path": "many/b.bin", "data": b"\x00B"}])
    assert sorted(w.path for w in written) == ["/home/user/many/a.txt", "/home/user/many/b.bin"]
    assert bytes(sbx.files.read("many/b.bin", format="bytes")) == b"\x00B"
    sbx.files.write("zipped.txt", "z" * 10000, gzip=True)
    assert sbx.files.read("zipped.txt") == "z" * 10000
    assert sbx.files.make_dir("sub/dir") is True and sbx.files.make_dir("sub/dir") is False
    moved = sbx.files.rename("notes.txt", "sub/dir/notes.txt")
    assert moved.path == "/home/user/sub/dir/notes.txt"
    deep = [e.path for e in sbx.files.list("/home/user/sub", depth=2)]
    assert deep == ["/home/user/sub/dir", "/home/user/sub/dir/notes.txt"]
    sbx.files.remove("sub")
    assert not sbx.files.exists("sub/dir/notes.txt")
    with pytest.raises(e2b.NotFoundException):
        sbx.files.read("nope.txt")
    with pytest.raises(e2b.InvalidArgumentException):
        sbx.files.list("/etc")  # only the workspace (/home/user) is reachable


def test_files_upload_download_urls_free_and_code_sees_files(sbx) -> None:
    sbx.files.write("from_sdk.txt", "written by the sdk")
    ex = sbx.run_code("print(open('from_sdk.txt').read())")
    assert ex.logs.stdout == ["written by the sdk\n"]
    r = sbx.commands.run("cat from_sdk.txt")
    assert r.stdout == "written by the sdk"


def test_watch_dir(sbx) -> None:
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched")
    try:
        sbx.files.write("watched/new.txt", "x")
        deadline = time.monotonic() + 10
        events = []
        while time.monotonic() < deadline and not events:
            events = handle.get_new_events()
            time.sleep(0.1)
    finally:
        handle.stop()
    assert any(ev.name == "new.txt" and ev.type == e2b.FilesystemEventType.CREATE for ev in events), events


def test_lifecycle_info_list_timeout_kill(e2b_env: Server) -> None:
    sb = e2b.Sandbox.create(metadata={"purpose": "lifecycle"}, timeout=120)
    try:
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id and info.metadata == {"purpose": "lifecycle"}
        found = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"purpose": "lifecycle"})).next_items()
        assert [s.sandbox_id for s in found] == [sb.sandbox_id]
        assert e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"purpose": "other"})).next_items() == []
        before = info.end_at
        sb.set_timeout(600)
        assert sb.get_info().end_at > before
        again = e2b.Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("echo connected").stdout == "connected\n"
        with pytest.raises(e2b.SandboxException, match="not supported"):
            sb.get_metrics()
    finally:
        assert sb.kill() is True
    assert not sb.is_running()
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.connect(sb.sandbox_id)


def test_pause_and_resume_keep_files_and_stop_the_timeout(e2b_env: Server) -> None:
    """``pause()`` stops the session's box and keeps its files; ``connect()`` resumes it (201), as
    does any use. No memory snapshot: a process or interpreter state does not survive."""
    sb = e2b.Sandbox.create(metadata={"purpose": "pause"}, timeout=120)
    try:
        sb.files.write("kept.txt", "still here")
        sb.commands.run("sleep 600", background=True)
        assert sb.pause() is True
        assert sb.pause() is False  # already paused: E2B's 409
        assert sb.get_info().state == e2b.SandboxState.PAUSED
        query = e2b.SandboxQuery(metadata={"purpose": "pause"}, state=[e2b.SandboxState.PAUSED])
        assert [s.sandbox_id for s in e2b.Sandbox.list(query=query).next_items()] == [sb.sandbox_id]
        running = e2b.SandboxQuery(metadata={"purpose": "pause"}, state=[e2b.SandboxState.RUNNING])
        assert e2b.Sandbox.list(query=running).next_items() == []
        left = sb.get_info().end_at
        time.sleep(1.5)  # paused: the deadline does not run down meanwhile
        again = e2b.Sandbox.connect(sb.sandbox_id)
        assert again.get_info().state == e2b.SandboxState.RUNNING
        assert again.get_info().end_at >= left + datetime.timedelta(seconds=1)  # moved by the pause
        assert again.files.read("kept.txt") == "still here"
        assert "sleep 600" not in again.commands.run("ps -eo args").stdout  # processes do not survive
        assert again.pause() is True
        assert again.files.read("kept.txt") == "still here"  # any use resumes it
        deadline = time.monotonic() + 10  # the sweeper notices within a second or so
        while again.get_info().state != e2b.SandboxState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.2)
        assert again.get_info().state == e2b.SandboxState.RUNNING
    finally:
        assert sb.kill() is True


def test_a_paused_sandbox_outlives_its_timeout(e2b_env: Server) -> None:
    """Its deadline passes while it is paused, and the sweeper (every second) leaves it alone.

    The deadline is made short only once the box runs and holds the file, so a slow box start on
    a loaded machine does not eat into it: only the pause itself has to land within it."""
    sb = e2b.Sandbox.create(timeout=60)
    try:
        sb.files.write("kept.txt", "x")
        sb.set_timeout(5)
        assert sb.pause() is True
        info = sb.get_info()
        assert info.state == e2b.SandboxState.PAUSED
        past = info.end_at + datetime.timedelta(seconds=3)  # three sweeps after the deadline
        while datetime.datetime.now(past.tzinfo) < past:
            time.sleep(0.1)
        again = e2b.Sandbox.connect(sb.sandbox_id, timeout=60)  # the sweeper left it alone
        assert again.get_info().state == e2b.SandboxState.RUNNING
        assert again.files.read("kept.txt") == "x"
    finally:
        sb.kill()


def test_templates_map_to_runtimes(e2b_env: Server) -> None:
    with pytest.raises(e2b.SandboxException) as missing:
        e2b.Sandbox.create(template="no-such-template", timeout=30)
    assert "404" in str(missing.value) and "not found" in str(missing.value)
    sb = ci.Sandbox.create(template="sci", timeout=30)  # the jail runtime the provider runs
    try:
        assert sb.run_code("import numpy\nint(numpy.int64(7))").text == "7"
    finally:
        sb.kill()


def test_timeout_expiry_kills(e2b_env: Server) -> None:
    sb = e2b.Sandbox.create(timeout=2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sb.is_running():
        time.sleep(0.5)
    assert not sb.is_running()


def test_second_tenant_cannot_see_or_use(e2b_env: Server, sbx) -> None:
    other = {"api_key": e2b_env.token_b}
    assert sbx.sandbox_id not in [s.sandbox_id for s in e2b.Sandbox.list(**other).next_items()]
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.connect(sbx.sandbox_id, **other)
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.get_info(sbx.sandbox_id, **other)
    assert e2b.Sandbox.kill(sbx.sandbox_id, **other) is False
    assert sbx.is_running()
    # the sandbox URL needs the sandbox's own access token: the sandbox id alone is not enough
    r = httpx.post(f"{e2b_env.url}/execute", json={"code": "1"},
                   headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"})
    assert r.status_code == 401


def test_bad_api_key(e2b_env: Server) -> None:
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.create(api_key="not-a-token")
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.list(api_key="not-a-token").next_items()


def test_bad_input_keeps_server_healthy(e2b_env: Server, sbx) -> None:
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
    stream = {**base, "E2b-Sandbox-Port": "49983", "Content-Type": "application/connect+proto"}
    bad_payload = b"\x00" + (5).to_bytes(4, "big") + b"\xff\xff\xff\xff\xff"  # an envelope of non-protobuf
    r = httpx.post(f"{e2b_env.url}/process.Process/Start", content=bad_payload, headers=stream)
    # an end-of-stream frame (flag 2) carrying a Connect error; a malformed message is invalid_argument
    assert r.status_code == 200 and r.content[0] == 2 and b'"invalid_argument"' in r.content, r.content
    huge_prefix = b"\x00\xff\xff\xff\xffjunk"  # claims a 4 GiB message: refused, not buffered
    r = httpx.post(f"{e2b_env.url}/process.Process/Start", content=huge_prefix, headers=stream)
    assert r.status_code == 200 and b'"resource_exhausted"' in r.content, r.content
    r = httpx.post(f"{e2b_env.url}/filesystem.Filesystem/Stat", content=b"{not json",
                   headers={**base, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = httpx.post(f"{e2b_env.url}/execute", content=b"{oops",
                   headers={**base, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"})
    assert r.status_code == 400
    r = httpx.get(f"{e2b_env.url}/files", params={"path": "x"},
                  headers={"E2b-Sandbox-Id": "doesnotexist", "E2b-Sandbox-Port": "49983"})
    assert r.status_code == 502  # what E2B's edge answers for a sandbox that is gone
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.connect("doesnotexist")
    r = httpx.post(f"{e2b_env.url}/v2/sandboxes", content=b"[1,2]",
                   headers={"X-API-KEY": e2b_env.token_a, "Content-Type": "application/json"})
    assert r.status_code == 400 and "message" in r.json()
    import gzip

    bomb = gzip.compress(b"\0" * (80 * 1024 * 1024))  # ~80 KiB that inflates past max_file_bytes
    r = httpx.post(f"{e2b_env.url}/files", params={"path": "bomb.bin"}, content=bomb,
                   headers={**base, "E2b-Sandbox-Port": "49983", "Content-Type": "application/octet-stream",
                            "Content-Encoding": "gzip"})
    assert r.status_code == 413
    # per-sandbox host names ({port}-{id}.{domain}) route like the headers do
    r = httpx.get(f"{e2b_env.url}/health", headers={"Host": f"49983-{sbx.sandbox_id}.sandboxes.example",
                                                     "X-Access-Token": sbx._envd_access_token})
    assert r.status_code == 204
    r = httpx.get(f"{e2b_env.url}/healthz", headers={"Host": f"49983-{sbx.sandbox_id}.elsewhere.example"})
    assert r.status_code == 200 and r.json() == {"status": "ok"}  # other domains: execbox's own API
    with pytest.raises(e2b.SandboxException):  # over the service's max_file_bytes (413)
        sbx.files.write("huge.bin", b"\0" * (65 * 1024 * 1024))
    assert sbx.run_code("'still ok'").text == "'still ok'"

