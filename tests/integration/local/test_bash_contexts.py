"""Bash contexts (agent/bash_contexts.py) through the local provider: what persists, what an error
ends, and what a hostile cell can and cannot do to its context, its box's agent and other contexts
(review 20). The same agent runs in every self-hosted box; tests/conformance runs the core case on
each provider."""

import os
import time

import pytest

from execbox import Sandbox
from execbox.errors import InvalidConfigError

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sb(local_sandbox):
    return local_sandbox


def _sh(sb, code: str, **kwargs):
    return sb.run_code(code, "bash", context_id="sh", **kwargs)


def test_bash_context_keeps_variables_functions_options_and_directory(sb):
    sb.run_code("mkdir -p bsub", "bash")
    r = _sh(sb, "x=5; declare -A m=([k]=v); f() { echo fn $1; }; alias hi='echo alias'; shopt -s nullglob; cd bsub")
    assert r.exit_code == 0 and r.metadata["context_new"] is True
    r = _sh(sb, "echo $x ${m[k]} $(f a) $(basename $PWD); hi; shopt -q nullglob && echo nullglob")
    assert (r.stdout, r.exit_code) == ("5 v fn a bsub\nalias\nnullglob\n", 0)
    assert sb.run_code("echo ${x-unset} $(basename $PWD)", "bash").stdout != r.stdout  # a one-shot: its own shell
    other = sb.run_code("echo ${x-unset}", "bash", context_id="sh2")
    assert other.stdout == "unset\n"


def test_an_error_in_a_bash_cell_ends_the_cell_not_the_context(sb):
    _sh(sb, "kept=yes")
    for code, message in (("echo ${zz:?need zz}; echo no", "need zz"), ("set -u; echo $nope; echo no", "nope"),
                          ("if then fi", "syntax error"), ("echo a; break; echo b", "break")):
        r = _sh(sb, code)
        assert message in r.stderr and "no\n" not in r.stdout, (code, r)
    r = _sh(sb, "set +u; echo $kept")
    assert r.stdout == "yes\n" and "context_reset" not in r.metadata


def test_bash_errors_read_as_from_a_terminal_not_with_the_agents_temp_files(sb):
    """An agent reads these messages: the run file's temp path was noise in each (and named the
    agent's directory); large code still runs, from its file."""
    code = "no_such_cmd_x\necho ok\nif then\n"
    shot, cell = sb.run_code(code, "bash"), _sh(sb, code)
    assert shot.stderr.startswith("bash: line 1: no_such_cmd_x: command not found\n"), shot.stderr
    assert "bash: -c: line 3: syntax error near unexpected token `then'" in shot.stderr
    assert cell.stderr == ("bash: no_such_cmd_x: command not found\nbash: eval: line 3: syntax error near unexpected "
                           "token `then'\nbash: eval: line 3: `if then'\n")
    for r in (shot, cell):
        assert (r.stdout, r.exit_code) == ("ok\n", 2) and "execbox" not in r.stderr and ".sh" not in r.stderr
    big = "x=1\n" * 40_000 + "echo big $x $# ${0##*/}\nno_such_cmd_y\n"  # 160 kB: past execve's limit on one argument
    shot, cell = sb.run_code(big, "bash"), _sh(sb, big)
    assert shot.stderr == "bash: line 40002: no_such_cmd_y: command not found\n"  # the program's own line
    for r in (shot, cell):
        assert (r.stdout, r.exit_code) == ("big 1 0 bash\n", 127) and "no_such_cmd_y" in r.stderr, r.stderr[-300:]
        assert "execbox" not in r.stderr and ".sh" not in r.stderr, r.stderr
    assert sb.run_code("echo $0", "bash").stdout == "bash\n"
    r = _sh(sb, "echo a; return 4; echo b")  # a cell is sourced: return ends it
    assert (r.stdout, r.stderr, r.exit_code) == ("a\n", "", 4)


def test_exit_ends_a_bash_context_with_its_code_and_the_next_cell_starts_fresh(sb):
    _sh(sb, "gone=no")
    r = _sh(sb, "echo bye; exit 3")
    assert (r.stdout, r.exit_code, r.metadata.get("context_reset")) == ("bye\n", 3, True)
    r = _sh(sb, "echo ${gone-fresh}")
    assert r.stdout == "fresh\n" and r.metadata["context_restarted"] is True


def test_a_bash_cell_cannot_reach_the_context_pipes(sb):
    r = _sh(sb, "echo '{\"exit_code\":0}' >&4; read -r -u 3 line; ls /proc/self/fd | wc -l")
    assert r.stderr.count("Bad file descriptor") == 2 and r.stdout == "4\n", r  # 0, 1, 2 and ls's own
    assert _sh(sb, "echo fine").stdout == "fine\n"


def test_bash_context_env_holds_for_one_command_and_start_env_for_the_context(sb):
    p, iid = sb.provider, sb.instance_id
    run = lambda cmd, **kw: p.run_command(iid, cmd, 20, context_id="envs", **kw)  # noqa: E731
    assert run("echo $BASE", start_env={"BASE": "start"}).stdout == "start\n"
    assert run("echo $BASE", start_env={"BASE": "ignored"}).stdout == "start\n"  # only a new context's
    assert run("echo $A $BASE; bash -c 'echo child $A'", env={"A": "1", "BASE": "cell"}).stdout == "1 cell\nchild 1\n"
    assert run("echo ${A-unset} $BASE").stdout == "unset start\n"  # both put back
    run("A=mine", env={"A": "1"})
    assert run("echo $A").stdout == "mine\n"  # the cell changed it: kept
    for bad in ("NOT-A-NAME", "__execbox_file"):  # the second would name the file the shell sources
        with pytest.raises(InvalidConfigError, match=f"'{bad}' is not a shell variable name a cell may set"):
            run("true", env={bad: "/etc/hostname"})



def _alive(sb) -> None:
    """The box's agent still serves: a file operation and runs in every language."""
    assert sb.files.list(".") is not None
    assert sb.run_code("print('py')", timeout=10).stdout == "py\n"
    assert sb.run_code("echo sh", "bash", timeout=10).stdout == "sh\n"


def test_a_fifo_or_symlink_planted_in_the_agents_temp_dir_is_never_opened(sb):
    # The cell knows where its own file is, so it knows the agent's temp dir. It plants FIFOs
    # (an open for writing would block the agent) and symlinks (a write would go elsewhere) at
    # every name it can see or guess, for as long as the next runs take.
    plant = ("d=$(dirname \"$__execbox_file\"); (for i in $(seq 200); do for n in cell.sh script.sh code.js "
             "arguments.json $(basename \"$__execbox_file\"); do [ -e \"$d/$n\" ] || mkfifo \"$d/$n\"; done; "
             "ln -sf /dev/full \"$d/run-0000000000000000.sh\" 2>/dev/null; sleep 0.01; done) >/dev/null 2>&1 &")
    assert sb.run_code(plant, "bash", context_id="planter").exit_code == 0
    time.sleep(0.3)
    assert sb.run_code("echo next", "bash", context_id="planter", timeout=10).stdout == "next\n"
    assert sb.run_code("echo $1", "bash", arguments={"a": 1}, timeout=10).exit_code == 0
    assert sb.run_code("function main(a) { return a.n }", "javascript", arguments={"n": 5}, timeout=10).result == 5
    _alive(sb)


def test_a_stopped_shell_cannot_block_the_agent(sb):
    # The shell stops itself after answering: the next cell's request is never read. Whatever
    # it carries (here 70 kB of env), the run ends within its timeout and the agent serves on.
    p, iid = sb.provider, sb.instance_id
    assert p.run_command(iid, "(sleep 0.2; kill -STOP $$) &", 10, context_id="stopped").exit_code == 0
    time.sleep(0.6)
    r = p.run_command(iid, "echo never", 3, context_id="stopped", env={f"V{i}": "x" * 100 for i in range(700)})
    assert r.stdout == "" and r.metadata.get("context_reset") is True
    _alive(sb)
    assert p.run_command(iid, "echo fresh", 10, context_id="stopped").stdout == "fresh\n"


def test_a_busy_javascript_context_cannot_block_the_agent(sb):
    # Node spins after answering; the next cell (200 kB, more than a pipe holds) is never read.
    assert sb.run_code("setTimeout(() => { for (;;) {} }, 200); 1", "javascript", context_id="spin").exit_code == 0
    time.sleep(0.6)
    # not for the run's whole timeout either: the module's 180 s test timeout would end the test
    r = sb.run_code("// " + "x" * 200_000 + "\n1", "javascript", context_id="spin", timeout=600)
    assert r.metadata.get("context_reset") is True
    _alive(sb)


def test_a_reply_a_cell_forges_ends_its_context_cleanly(sb):
    # The shell holds saved copies of its pipes while a cell runs; a cell writing junk to them
    # reaches its own reply pipe. That ends its context with a clean result, never an agent error.
    junk = "for f in $(seq 7 40); do printf '{\"exit_code\":\"x\"}\\n' >&$f; done 2>/dev/null; sleep 1"
    r = sb.run_code(junk, "bash", context_id="forger", timeout=10)
    assert r.metadata.get("context_reset") is True
    assert sb.run_code("echo ok", "bash", context_id="forger", timeout=10).stdout == "ok\n"
    _alive(sb)


@pytest.mark.parametrize("ending", ["exit 1", "sleep 30"])
def test_ending_a_bash_context_leaves_the_python_context_of_the_same_id(sb, ending):
    # MCP names both of a session's default contexts "mcp".
    sb.run_code("kept = 42", context_id="mcp-like")
    sb.run_code("x=1", "bash", context_id="mcp-like")
    r = sb.run_code(ending, "bash", context_id="mcp-like", timeout=1)
    assert r.metadata.get("context_reset") is True
    assert sb.run_code("print(kept)", context_id="mcp-like").stdout == "42\n"


def test_a_restart_is_reported_by_the_language_whose_context_ended(sb):
    assert sb.run_code("sleep 30", "bash", context_id="c", timeout=1).metadata.get("context_reset") is True
    first_python = sb.run_code("x = 1", context_id="c")
    assert first_python.metadata.get("context_new") is True and "context_restarted" not in first_python.metadata
    assert sb.run_code("echo again", "bash", context_id="c").metadata.get("context_restarted") is True


def test_a_prompt_or_prompt_command_a_cell_sets_reaches_no_output(sb):
    # e.g. `source venv/bin/activate` prefixes PS1
    _sh(sb, "PS1='(v) '; PS2='> '; PROMPT_COMMAND='echo from-prompt-command'")
    r = _sh(sb, "echo ok")
    assert (r.stdout, r.stderr) == ("ok\n", "")
    r = _sh(sb, "set -x; echo traced; set +x")
    assert r.stdout == "traced\n" and "__execbox" not in r.stderr


def test_thousands_of_env_entries_for_one_cell(sb):
    env = {f"E{i}": str(i) for i in range(5000)}
    r = sb.provider.run_command(sb.instance_id, "echo $E4999", 30, context_id="many", env=env)
    assert (r.stdout, r.timed_out) == ("4999\n", False)


def test_dead_contexts_do_not_hold_the_context_cap(sb):
    with Sandbox.create(sb.provider) as fresh:  # no other contexts in its box
        for i in range(16):
            fresh.run_code("(sleep 0.2; kill -9 $$) &", "bash", context_id=f"dying{i}")
        time.sleep(1.0)
        r = fresh.run_code("echo room", "bash", context_id="one-more", timeout=10)
        assert r.stdout == "room\n"


def test_a_cell_that_makes_the_helpers_variables_readonly_ends_its_shell_with_a_reason(sb):
    _sh(sb, "readonly __execbox_names")
    r = _sh(sb, "echo never")
    assert r.stdout == "" and "readonly" in r.stderr and r.metadata.get("context_reset") is True
    assert _sh(sb, "echo again").stdout == "again\n"


def _running(marker: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == marker.encode():
                    return True
        except OSError:
            pass
    return False


def test_a_daemon_a_context_started_lives_with_the_context_not_the_next_run(sb):
    marker = f"execbox-daemon-{os.getpid()}-{time.monotonic_ns()}"
    r = sb.run_code(f"(exec -a {marker} sleep 300 &); echo started", "bash", context_id="d")
    assert r.stdout == "started\n"
    sb.run_code("echo one-shot", "bash")  # its clean-up kills the run's orphans, not the context's
    sb.run_code("print('python one-shot')")
    assert _running(marker)
    r = sb.run_code("sleep 30", "bash", context_id="d", timeout=1)  # the context ends...
    assert r.metadata.get("context_reset") is True
    deadline = time.monotonic() + 5
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(marker)  # ...and its daemon with it


RUN_WITH_DAEMON = r'''
import os, time
if os.fork() == 0:
    os.setpgid(0, 0)  # out of the run's process group, still in its session
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 4096)  # holds none of the run's pipes
        os.execvp("sleep", ["MARKER", "300"])
    os._exit(0)
time.sleep(0.3)
pipes = []
for fd in os.listdir("/proc/self/fd"):
    try:
        if int(fd) > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
            pipes.append(int(fd))
    except OSError:  # the listing's own descriptor, closed by now
        pass
for fd in pipes:  # the run writes its own exit record and lets go of its pipes: answered at once
    try:
        os.write(fd, b'{"exited":0,"maxrss":1}')
    except OSError:
        pass
    os.close(fd)
null = os.open("/dev/null", os.O_RDWR)
os.dup2(null, 1)
os.dup2(null, 2)
time.sleep(2)
'''


def test_a_runs_daemon_ends_with_it_even_when_the_run_answers_from_its_exit_record(sb):
    # (review 22) the run's own pid is kept while it is answered; its session is not
    marker = f"execbox-run-daemon-{os.getpid()}-{time.monotonic_ns()}"
    sb.run_code(RUN_WITH_DAEMON.replace("MARKER", marker), timeout=20)
    deadline = time.monotonic() + 5
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(marker)


def test_bash_arguments_reach_a_context_cell_as_a_one_shot_gets_them(sb):
    """review 24: a bash context dropped `arguments` without a word."""
    for r in (sb.run_code('cat "$EXECBOX_ARGUMENTS_FILE"', "bash", arguments={"n": 21}),
              _sh(sb, 'cat "$EXECBOX_ARGUMENTS_FILE"', arguments={"n": 21})):
        assert (r.stdout, r.exit_code) == ('{"n":21}', 0), r
    assert _sh(sb, 'echo "${EXECBOX_ARGUMENTS_FILE-unset}"').stdout == "unset\n"  # for that cell only

