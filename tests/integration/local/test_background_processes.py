"""Background processes in the agent: they run beside exec, files and each other (local provider)."""

from __future__ import annotations

import threading
import time

import pytest

from execbox.errors import SandboxError
from tests.conftest import wait_process_exit

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def box():
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_memory": "512m"})
    inst = p.create_instance("python")
    yield p, inst.instance_id
    p.shutdown()


def test_output_exit_code_env_and_cwd(box) -> None:
    p, iid = box
    p.write_file(iid, "sub/f.txt", "x")
    pid = p.start_process(iid, "echo out; echo err >&2; echo $GREETING; ls; exit 3", cwd="sub",
                          env={"GREETING": "hej"})
    out, err, v = wait_process_exit(p, iid, pid)
    assert (out, err, v["exit_code"]) == (b"out\nhej\nf.txt\n", b"err\n", 3)
    with pytest.raises(SandboxError) as gone:  # reported once, then forgotten
        p.poll_process(iid, pid, 0, 0)
    assert gone.value.http_status == 404


def test_runs_while_exec_holds_the_agent(box) -> None:
    """An exec runs until the test releases it; meanwhile a background process starts, streams,
    takes stdin and is listed."""
    p, iid = box
    result = {}
    hold = ("import os, time\nopen('exec-started', 'w').close()\nt = time.monotonic()\n"
            "while not os.path.exists('exec-release') and time.monotonic() - t < 60:\n    time.sleep(0.05)\n"
            "print('slow done')")
    runner = threading.Thread(target=lambda: result.setdefault(
        "r", p.execute_code(iid, hold, "python", timeout=120)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not p.glob(iid, "exec-started") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.glob(iid, "exec-started"), "the exec did not start"
    pid = p.start_process(iid, "read line; echo got:$line; cat", stdin=True)
    assert pid in [q["pid"] for q in p.list_processes(iid)]
    p.process_input(iid, pid, b"hello\n")
    p.process_input(iid, pid, b"more bytes\n")
    p.close_process_input(iid, pid)  # EOF ends `cat`
    out, _, v = wait_process_exit(p, iid, pid)
    assert runner.is_alive(), "the exec ended before it was released"
    assert out == b"got:hello\nmore bytes\n" and v["exit_code"] == 0
    p.write_file(iid, "exec-release", "")
    runner.join(60)
    assert result["r"].stdout == "slow done\n"
    p.run_command(iid, "rm -f exec-started exec-release")


def test_signal_kills_the_whole_job_and_exec_does_not_reap_it(box) -> None:
    p, iid = box
    pid = p.start_process(iid, "sleep 61.234 & echo started; wait")
    v = p.poll_process(iid, pid, 0, 0)
    # an exec ending cleans up its own leftovers, never a background process
    assert p.execute_code(iid, "print(1)", "python").stdout == "1\n"
    assert pid in [q["pid"] for q in p.list_processes(iid) if q["running"]]
    assert p.signal_process(iid, pid, "SIGKILL") is True
    _, _, v = wait_process_exit(p, iid, pid)
    assert v["exited"] and v["signal"] == 9
    r = p.run_command(iid, "pgrep -f 'sleep 61.23[4]' || echo none")
    assert r.stdout.strip() == "none"


def test_bad_requests(box) -> None:
    p, iid = box
    with pytest.raises(SandboxError) as e:
        p.start_process(iid, "true", cwd="../../etc")
    assert e.value.code == "SB002"
    pid = p.start_process(iid, "sleep 30")
    with pytest.raises(SandboxError) as e:  # started without stdin
        p.process_input(iid, pid, b"x")
    assert e.value.http_status == 409
    with pytest.raises(SandboxError):
        p.signal_process(iid, pid, "SIGBOGUS")
    assert p.signal_process(iid, pid, "SIGTERM") is True
    _, _, v = wait_process_exit(p, iid, pid)
    assert v["signal"] == 15


def test_javascript_contexts_keep_globals_and_restart_after_timeout(box) -> None:
    import shutil

    from tests.conftest import require

    require(shutil.which("node") is not None, "node (JavaScript contexts)")
    p, iid = box
    r = p.execute_code(iid, "var a = 41; let b = 1; function f() { return a + b }; console.log('set')",
                       "javascript", context_id="js1")
    assert (r.stdout, r.exit_code, r.metadata.get("context_new")) == ("set\n", 0, True)
    r = p.execute_code(iid, "console.error('e'); f()", "javascript", context_id="js1")
    assert (r.stderr, r.result, r.metadata.get("context_new")) == ("e\n", 42, None)
    assert p.execute_code(iid, "typeof a", "javascript", context_id="js2").result == "undefined"
    r = p.execute_code(iid, "while (true) {}", "javascript", timeout=1, context_id="js1")
    assert r.timed_out and "context_reset" not in r.metadata  # interrupted, as a notebook's cell
    assert p.execute_code(iid, "typeof f", "javascript", context_id="js1").result == "function"
    r = p.execute_code(iid, "await null; while (true) {}", "javascript", timeout=1, context_id="js1")
    assert r.timed_out and r.metadata.get("context_reset")  # past its first await: killed
    r = p.execute_code(iid, "typeof f", "javascript", context_id="js1")
    assert r.result == "undefined" and r.metadata.get("context_restarted")
    assert p.reset_context(iid, "js2") is True
    assert p.reset_context(iid, "js2") is False


def test_pty_process_has_a_terminal_and_takes_resizes(box) -> None:
    p, iid = box
    pid = p.start_process(iid, "stty size; read line; stty size; echo got:$line; exit 4", pty=(100, 30))
    out = err = b""
    deadline = time.monotonic() + 30
    while b"\n" not in out and time.monotonic() < deadline:  # the first `stty size` has run
        v = p.poll_process(iid, pid, len(out), len(err))
        out, err = out + v["stdout"], err + v["stderr"]
        time.sleep(0.01)
    assert out.startswith(b"30 100\r\n"), out  # the size it started with
    p.resize_process(iid, pid, 120, 40)
    p.process_input(iid, pid, b"typed\n")
    deadline = time.monotonic() + 30
    while not v["exited"] and time.monotonic() < deadline:
        v = p.poll_process(iid, pid, len(out), len(err))
        out, err = out + v["stdout"], err + v["stderr"]
        time.sleep(0.01)
    assert v["exited"], out
    assert err == b"" and v["exit_code"] == 4  # a terminal has one output stream
    assert out.replace(b"\r\n", b"\n").endswith(b"40 120\ngot:typed\n"), out
    with pytest.raises(SandboxError) as e:  # no terminal, nothing to resize
        p.resize_process(iid, p.start_process(iid, "sleep 5"), 80, 24)
    assert e.value.http_status == 409


def test_a_flood_is_paused_until_read_and_read_output_is_freed(box, tmp_path) -> None:
    from execbox.agent.bg_output import _punch

    p, iid = box
    pid = p.start_process(iid, "yes 0123456789012345678901234567890123456789")

    def state() -> str:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    deadline = time.monotonic() + 30
    while state() != "T" and time.monotonic() < deadline:  # nothing read: the backlog grows
        time.sleep(0.1)
        p.poll_process(iid, pid, 0, 0)
    assert state() == "T"  # stopped until the host catches up
    assert p.signal_process(iid, pid, "SIGKILL") is True  # ends it at once, backlog dropped
    assert wait_process_exit(p, iid, pid, timeout=10)[2]["signal"] == 9
    f = tmp_path / "out"
    f.write_bytes(b"x" * (4 << 20))
    assert _punch(str(f), (2 << 20) + 100) == 2 << 20
    st = f.stat()
    assert st.st_size == 4 << 20 and st.st_blocks * 512 <= (2 << 20) + 65536


def test_a_late_process_reply_is_not_a_dead_box(box) -> None:
    """A proc.* op that times out (the agent busy with a long file op) fails alone; the box lives."""
    from execbox.errors import ProviderUnavailableError

    p, iid = box
    client = p._instances[iid].box.client
    with pytest.raises(ProviderUnavailableError) as busy:
        client.call("proc.list", timeout=0)
    assert busy.value.details.get("busy") is True and not client.dead
    assert p.list_processes(iid) is not None and p.execute_code(iid, "print(2)", "python").stdout == "2\n"
