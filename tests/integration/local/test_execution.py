"""Execution semantics through the local provider (the same agent runs in every self-hosted box)."""

import json
import os
import time

import pytest

from execbox import Sandbox, execute_code
from execbox.errors import InvalidConfigError

from .conftest import local_box

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sb():
    with local_box("512m") as s:
        yield s


# -- languages, arguments, results --------------------------------------------------------------

def test_python_plain_script(sb):
    r = sb.run_code("print('hello')\nimport sys; print('warn', file=sys.stderr)")
    assert (r.stdout, r.stderr, r.exit_code, r.result) == ("hello\n", "warn\n", 0, None)
    assert r.metadata["result_present"] is False
    assert r.metadata["isolation"] == "none" and r.metadata["warnings"]


def test_python_main_with_arguments(sb):
    code = "def main(name: str, count: int) -> dict:\n    return {'message': f'Hello {name}!' * count}"
    r = sb.run_code(code, arguments={"name": "World", "count": 3})
    assert r.result == {"message": "Hello World!Hello World!Hello World!"}
    assert r.stdout == ""  # the value never travels in stdout


def test_python_main_without_arguments_is_called(sb):
    r = sb.run_code("def main():\n    print('in main')\n    return [1, 2]")
    assert r.stdout == "in main\n" and r.result == [1, 2]


def test_python_main_guard_runs_once(sb):
    r = sb.run_code("def main():\n    print('ran')\n    return 5\nif __name__ == '__main__':\n    main()")
    assert r.stdout == "ran\n"


def test_python_main_guard_with_arguments_calls_main_once(sb):
    code = "def main(x):\n    print('ran')\n    return x\nif __name__ == '__main__':\n    main(0)"
    r = sb.run_code(code, arguments={"x": 7})
    assert r.stdout == "ran\n" and r.result == 7


def test_arguments_without_main_is_an_error(sb):
    r = sb.run_code("print(1)", arguments={"a": 1})
    assert r.exit_code == 1 and "no main()" in r.stderr


@pytest.mark.parametrize("value", ["'s'", "42", "3.5", "True", "None", "[1, 'a', None]", "{'k': {'n': [1]}}",
                                   "''", "[]", "{}"])
def test_every_json_type_roundtrips(sb, value):
    r = sb.run_code(f"def main():\n    return {value}")
    assert r.exit_code == 0, r.stderr
    assert r.result == eval(value)  # noqa: S307 - literal from the parametrize list
    assert r.metadata["result_present"] is True


@pytest.mark.parametrize("value,word", [("object()", "object"), ("float('nan')", "NaN"), ("{1, 2}", "set")])
def test_non_serializable_result_is_a_clear_error(sb, value, word):
    r = sb.run_code(f"def main():\n    return {value}")
    assert r.exit_code == 1
    assert "not JSON-serializable" in r.stderr and r.result is None


def test_javascript_main_with_and_without_arguments(sb, node_available):
    if not node_available:
        pytest.skip("node is not installed")
    r = sb.run_code("function main(args) { const {name, count} = args; return `Hello ${name}!`.repeat(count); }",
                    "javascript", arguments={"name": "World", "count": 3})
    assert r.result == "Hello World!Hello World!Hello World!" and r.stdout == ""
    r = sb.run_code("console.log('plain'); console.error('e')", "js")
    assert (r.stdout, r.stderr, r.exit_code) == ("plain\n", "e\n", 0)
    r = sb.run_code("async function main() { return {ok: true, n: [1, null]}; }", "nodejs")
    assert r.result == {"ok": True, "n": [1, None]}
    r = sb.run_code("function main() { return 10n; }", "js")
    assert r.exit_code == 1 and "not JSON-serializable" in r.stderr
    r = sb.run_code("throw new Error('bad')", "js")
    assert r.exit_code == 1 and "Error: bad" in r.stderr


def test_javascript_errors_show_the_users_frames_not_the_runners(sb, node_available):
    """As Python's traceback starts at <code>: the vm calls and the runner's own frames below the
    user's code are noise an agent reads (and named the agent's path)."""
    if not node_available:
        pytest.skip("node is not installed")
    r = sb.run_code("console.log(1);\nnull.x", "js")
    assert r.stderr.rstrip().endswith("TypeError: Cannot read properties of null (reading 'x')\n    at <code>:2:6")
    r = sb.run_code("function inner() { return null.y }\nasync function main() { await 1; return inner() }", "js")
    assert r.stderr.rstrip().splitlines()[-2:] == ["    at inner (<code>:1:32)", "    at main (<code>:2:41)"], r.stderr
    r = sb.run_code("let x = (;", "js")
    assert "SyntaxError: Unexpected token ';'" in r.stderr and " at " not in r.stderr, r.stderr
    for out in (r, sb.run_code("null.x", "js", context_id="stack")):
        assert "js_runner" not in out.stderr and "js_context" not in out.stderr and "node:vm" not in out.stderr


def test_metadata_limits_name_the_runs_own_timeout(sb):
    r = sb.run_code("import time; time.sleep(5)", timeout=1)
    assert r.timed_out and r.metadata["limits"]["timeout"] == 1 and r.metadata["error_code"] == "SB005"
    assert sb.run_code("pass", timeout=2.5).metadata["limits"]["timeout"] == 2.5


def test_bash_with_and_without_arguments(sb):
    r = sb.run_code("echo out; echo err >&2; exit 3", "bash")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    r = sb.run_code('cat "$EXECBOX_ARGUMENTS_FILE"', "bash", arguments={"a": 1})
    assert json.loads(r.stdout) == {"a": 1}


def test_unknown_language_is_sb002(sb):
    with pytest.raises(InvalidConfigError) as ei:
        sb.run_code("x", "cobol")
    assert ei.value.details["field"] == "language"


def test_syntax_error_reported(sb):
    r = sb.run_code("def (:")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr


def test_exception_traceback_shows_user_line(sb):
    r = sb.run_code("x = 1\nraise ValueError('nope')")
    assert r.exit_code == 1
    assert 'File "<code>", line 2' in r.stderr and "raise ValueError('nope')" in r.stderr
    assert "execbox" not in r.stderr.split("Traceback")[1].split("<code>")[0]


def test_nonzero_exit(sb):
    assert sb.run_code("import sys; sys.exit(7)").exit_code == 7
    r = sb.run_code("raise SystemExit('bye')")
    assert r.exit_code == 1 and "bye" in r.stderr


# -- limits ---------------------------------------------------------------------------------------

def test_timeout_kills_tree_and_sets_flag(sb):
    r = sb.run_code(f"import subprocess\nsubprocess.Popen(['sleep', '{LONG}'])\nimport time\ntime.sleep(300)",
                    timeout=1)
    assert r.timed_out and r.error_code == "SB005" and r.execution_time < 10
    assert not _sleepers(), "a child of the timed-out run survived"


def test_timeout_when_sigterm_is_ignored(sb):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n" \
           "while True: time.sleep(0.1)"
    r = sb.run_code(code, timeout=1)
    assert r.timed_out and r.stdout == "up\n"
    r = sb.run_code("trap '' TERM; sleep 300", "bash", timeout=1)
    assert r.timed_out


def test_background_processes_end_with_the_run(sb):
    r = sb.run_code(f"sleep {LONG} & echo started", "bash")
    assert r.stdout == "started\n" and r.execution_time < 5
    assert not _sleepers()


def test_daemonized_process_is_killed(sb):
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execvp('sleep', ['sleep', '{LONGER}'])\n    os._exit(0)\nos.wait()\nprint('parent done')")
    r = sb.run_code(code)
    assert r.stdout == "parent done\n"
    time.sleep(0.1)
    assert not _sleepers(LONGER)


def test_output_truncation():
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_output_bytes": 4096})
    try:
        with Sandbox.create(p) as s:
            r = s.run_code("print('x' * 100000)\nimport sys\nprint('y' * 10, file=sys.stderr)")
            assert r.truncated and len(r.stdout) == 4096 and r.stderr == "y" * 10 + "\n"
            assert r.exit_code == 0
    finally:
        p.shutdown()


def test_memory_bomb_is_sb006(sb):
    r = sb.run_code("x = bytearray(2 * 1024**3)")
    assert r.error_code == "SB006" and "MemoryError" in r.stderr
    assert sb.run_code("print('still fine')").stdout == "still fine\n"


def test_peak_memory_reported(sb):
    r = sb.run_code("x = bytearray(50 * 1024**2)\nx[::4096] = b'1' * len(x[::4096])")
    assert r.metadata["peak_memory_kb"] > 50 * 1024


# -- artifacts -----------------------------------------------------------------------------------

def test_file_artifact(sb):
    r = sb.run_code("open('artifacts/report.csv', 'w').write('a,b\\n1,2\\n')")
    [a] = [a for a in r.artifacts if a.name == "report.csv"]
    assert a.mime_type == "text/csv" and a.size == 8
    assert a.read_bytes() == b"a,b\n1,2\n"
    r2 = sb.run_code("print('no new files')")
    assert r2.artifacts == []


def test_matplotlib_figure_artifact(sb):
    pytest.importorskip("matplotlib")
    r = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')")
    assert r.exit_code == 0, r.stderr
    pngs = [a for a in r.artifacts if a.mime_type == "image/png"]
    assert len(pngs) == 1
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_warning_from_saving_a_figure_names_no_agent_file(sb):
    """A glyph the font lacks is warned about when the figure is saved, after the code ran: the
    warning is shown, not the agent's file and line that saved it."""
    pytest.importorskip("matplotlib")
    r = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.title('\\u6f22')")
    assert r.exit_code == 0 and len(r.artifacts) == 1, r.stderr
    assert r.stderr.startswith("UserWarning: Glyph 28450") and "runners.py" not in r.stderr, r.stderr

def test_one_shot_artifacts_carry_bytes():
    r = execute_code("open('artifacts/out.txt', 'w').write('data')", provider="local")
    [a] = r.artifacts
    assert a.has_content and a.read_bytes() == b"data"


# -- contexts ------------------------------------------------------------------------------------

def test_context_keeps_state(sb):
    assert sb.run_code("counter = 41", context_id="ctx").exit_code == 0
    r = sb.run_code("counter += 1\nprint(counter)", context_id="ctx")
    assert r.stdout == "42\n" and r.metadata["context_executions"] == 2
    r = sb.run_code("print('counter' in globals())")
    assert r.stdout == "False\n"  # one-shot runs do not see the context


def test_a_context_cell_past_its_time_is_interrupted_and_the_state_kept(sb):
    """As a notebook's interrupt: KeyboardInterrupt in the cell, the context's globals kept."""
    sb.run_code("state = 'kept'", context_id="slow")
    r = sb.run_code("import time\nwhile True: time.sleep(0.05)", context_id="slow", timeout=1)
    assert r.timed_out and r.exit_code == 1 and "context_reset" not in r.metadata, r.metadata
    assert r.stderr.rstrip().endswith("KeyboardInterrupt"), r.stderr
    assert r.metadata["context_note"] == "context 'slow' was interrupted (timeout); its state is kept"
    r = sb.run_code("print(state)", context_id="slow")
    assert r.stdout == "kept\n" and not r.metadata.get("context_restarted"), r.metadata


def test_an_interrupt_sent_before_the_cell_started_is_sent_again(sb):
    """A timeout that passes before the context has started the cell (it ignores SIGINT between
    cells): the interrupt is repeated within its grace, so the cell is interrupted, not killed."""
    sb.run_code("state = 'kept'", context_id="early")
    # a long cell: its request is still being read when the timeout passes
    code = "# " + "x" * 900_000 + "\nimport time\nfor _ in range(40):\n    time.sleep(0.1)"
    for _ in range(3):
        r = sb.run_code(code, context_id="early", timeout=0.0001)
        assert r.timed_out and "context_reset" not in r.metadata, r.metadata
    assert sb.run_code("print(state)", context_id="early").stdout == "kept\n"


def test_a_context_cell_that_ignores_its_interrupt_is_killed(sb):
    sb.run_code("state = 'kept'", context_id="stubborn")
    code = "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass"
    r = sb.run_code(code, context_id="stubborn", timeout=1)
    assert r.timed_out and r.metadata.get("context_reset") is True, r.metadata
    r = sb.run_code("print(globals().get('state', 'gone'))", context_id="stubborn")
    assert r.stdout == "gone\n"
    assert r.metadata.get("context_restarted") is True
    assert "restarted" in r.metadata.get("context_note", "")


@pytest.mark.parametrize("language, code, probe", [
    ("python", "import threading, os; threading.Timer(0.2, os._exit, (0,)).start()", "print('alive')"),
    ("javascript", "setTimeout(() => process.exit(0), 200); 1", "console.log('alive')"),
    ("bash", "(sleep 0.2; kill -9 $$) &", "echo alive"),
])
def test_a_context_that_ended_after_its_cell_is_started_afresh(sb, language, code, probe):
    assert sb.run_code(code, language, context_id=f"late-{language}").exit_code == 0
    time.sleep(1.0)
    r = sb.run_code(probe, language, context_id=f"late-{language}", timeout=10)
    assert (r.stdout, r.exit_code, r.metadata.get("context_restarted")) == ("alive\n", 0, True), r


# -- streaming and cancel ------------------------------------------------------------------------

def test_streaming_callback_receives_output_in_order(sb):
    seen = []
    r = sb.run_code("import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.05)",
                    on_output=lambda stream, text: seen.append((stream, text)))
    assert "".join(t for s, t in seen if s == "stdout") == "0\n1\n2\n" == r.stdout
    assert len(seen) >= 2  # arrived in pieces, not once at the end


def test_cancel_stops_a_run(sb):
    import threading

    timer = threading.Timer(0.5, lambda: sb.provider.cancel(sb.instance_id))
    timer.start()
    r = sb.run_code("import time\ntime.sleep(30)", timeout=30)
    assert r.metadata.get("cancelled") is True and r.execution_time < 10


# -- helpers -------------------------------------------------------------------------------------

# The sleeps these tests leave for the sandbox to kill carry this run's pid in their duration, so a
# `sleep 300` elsewhere on the machine (another test run, a shell) is never taken for a survivor.
LONG, LONGER = f"300.{os.getpid()}", f"301.{os.getpid()}"


def _sleepers(tag: str = LONG) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"sleep") and tag.encode() in cmd:
            out.append(pid)
    return out


def test_spare_child_is_ready_between_runs_and_replaced_when_killed(local_sandbox):
    """The agent forks the next run's child ahead of time; a spare that dies while waiting (OOM
    killer, a signal) only costs that speed-up, never a run."""
    import signal

    sb = local_sandbox
    agent_pid = sb.provider._instances[sb.instance_id].box.proc.pid

    def agent_children() -> list[int]:
        return _children(agent_pid)

    sb.run_code("print('warm up')")
    time.sleep(0.05)
    [spare] = agent_children()
    r = sb.run_code("import os\nprint(os.getpid())")
    assert r.stdout == f"{spare}\n"  # the run used the child forked ahead of time
    time.sleep(0.05)
    [spare] = agent_children()
    os.kill(spare, signal.SIGKILL)
    time.sleep(0.05)
    for _ in range(3):
        r = sb.run_code("import os\nprint(os.getppid())")
        assert r.exit_code == 0 and r.stdout == f"{agent_pid}\n"


def test_a_python_run_is_answered_from_its_exit_record_and_leaves_no_zombie(local_sandbox):
    """A Python run's child reports its exit code and peak memory on the result pipe and closes
    its pipes; the agent answers from that and reaps the child as soon as it exits."""
    sb = local_sandbox
    agent_pid = sb.provider._instances[sb.instance_id].box.proc.pid
    r = sb.run_code("import sys; x = bytearray(40 * 1024 * 1024); print('big'); sys.exit(5)")
    assert (r.exit_code, r.stdout) == (5, "big\n")
    assert r.metadata["peak_memory_kb"] > 40 * 1024  # the child's own high-water mark
    time.sleep(0.1)
    states = [_state(pid) for pid in _children(agent_pid)]
    assert states == ["S"], states  # only the next run's waiting spare; no zombie left behind


def test_a_run_that_forges_its_exit_record_is_still_killed(sb, tmp_path):
    """User code can write to its own result pipe. If it fakes the exit record and closes its
    pipes but keeps running, the run ends anyway: the process is killed when it is answered."""
    marker = tmp_path / "forger.pid"
    code = f"""
import os, time
open({str(marker)!r}, "w").write(str(os.getpid()))
for fd in range(3, 64):
    try:
        if os.path.islink(f"/proc/self/fd/{{fd}}") and "pipe:" in os.readlink(f"/proc/self/fd/{{fd}}"):
            os.write(fd, b'{{"exited":0,"maxrss":1}}')
            os.close(fd)
    except OSError:
        pass
os.close(1); os.close(2)
time.sleep(300)
"""
    r = sb.run_code(code, timeout=60)
    pid = int(marker.read_text())
    assert not r.timed_out
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    assert not _alive(pid)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R, S, Z...); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def test_kill_tree_does_not_spin_on_a_dead_unreaped_child(tmp_path):
    """A killed process stays a zombie until its parent reaps it, and signalling a zombie
    succeeds: kill_tree used to count it as alive and retry 50 times (~100 ms per run that left
    a background process). Run in a child process: kill_tree also kills its caller's orphans."""
    import subprocess
    import sys

    script = (
        "import os, time\n"
        "from execbox.agent import procs\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print(procs.kill_tree(pid))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_a_spare_forked_during_a_run_holds_none_of_that_runs_pipes(local_sandbox):
    """From a box's second run on, the next spare is forked while a run executes; it must not
    inherit the agent's ends of that run's pipes (the next run's code could read them)."""
    code = ("import os\n"
            "print(sum('pipe:' in os.readlink(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd')\n"
            "          if os.path.exists(f'/proc/self/fd/{f}')))")
    counts = [local_sandbox.run_code(code).stdout for _ in range(4)]
    assert counts == ["3\n"] * 4  # its own stdout, stderr and result pipe


def test_a_session_agent_imports_what_user_code_commonly_needs_so_every_run_inherits_it(local_sandbox):
    """The agent's own code does without re/json/linecache (agent/lean.py); a box that serves many
    runs imports them once at start (main.USER_IMPORTS), so no run pays for them again."""
    sb = local_sandbox
    r = sb.run_code("import sys\nprint(sorted(m for m in ('re', 'json', 'linecache') if m in sys.modules))")
    assert r.stdout == "['json', 'linecache', 're']\n"
    r = sb.run_code("import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n")
    assert 'File "<code>", line 3' in r.stderr and "1 / 0" in r.stderr


def test_a_new_context_holds_only_the_pipes_of_its_own_run(local_sandbox):
    """A context child is forked while the agent holds the write ends of the run that starts it.
    It used to keep them: the run's stdout never reached EOF, so every new context's first run
    waited out the pump's drain grace (~200 ms, the Docker pool's pre-warm included)."""
    sb = local_sandbox
    code = ("import os\n"
            "print(sum('pipe:' in os.readlink(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd')\n"
            "          if os.path.exists(f'/proc/self/fd/{f}')))")
    counts = [sb.provider.execute_code(sb.instance_id, code, "python", 30, context_id=cid).stdout
              for cid in ("c1", "c2", "c1")]
    assert counts == ["3\n"] * 3  # its own stdout, stderr and result pipe
    assert sb.run_code(code).stdout == "3\n"  # and a spare forked beside the contexts
