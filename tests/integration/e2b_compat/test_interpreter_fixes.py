"""The code interpreter facade as E2B's SDK sees it: busy contexts, IPython cell semantics, envs,
context cwd and the output cap (review 17), with the official SDK against a real `execbox serve`."""

from __future__ import annotations

import builtins
import re
import threading
import time
from collections.abc import Iterator

import pytest

from execbox.policy import AstPolicy
from execbox.service.e2b_compat.cells import python_cell

from .conftest import Server, module_sandbox

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")

CAP = 1024 * 1024  # the jail's default output cap per stream


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: ci.Sandbox.create(timeout=300, envs={"SBX_ENV": "from-create"})) as sandbox:
        yield sandbox


def _cell_in_thread(sbx, code: str, **kwargs) -> tuple[threading.Thread, dict, threading.Event]:
    """Run a cell on a thread; the event is set once the cell printed (it is running)."""
    out: dict[str, object] = {}
    started = threading.Event()

    def go() -> None:
        try:
            out["ex"] = sbx.run_code(code, on_stdout=lambda _m: started.set(), timeout=60, **kwargs)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out["exc"] = e

    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    assert started.wait(30), f"the cell did not start: {out}"
    return runner, out, started


# -- 1: a cell the caller gave up on, or whose context is restarted, lets go of the sandbox ----
def test_sdk_timeout_stops_the_cell_and_frees_the_sandbox(sbx) -> None:
    ctx = sbx.create_code_context()
    with pytest.raises(e2b.TimeoutException):
        sbx.run_code("while True: pass", context=ctx, timeout=1)
    started = time.monotonic()
    assert sbx.run_code("'free'", timeout=10).text == "'free'"  # another context: the session is free
    assert sbx.commands.run("echo ok", timeout=10).stdout == "ok\n"
    assert sbx.run_code("1 + 1", context=ctx, timeout=10).text == "2"  # the context is usable again
    assert time.monotonic() - started < 10


def test_a_javascript_cell_the_sdk_gave_up_on_is_interrupted_and_its_context_kept(sbx) -> None:
    """As a Python cell: the interrupt ends the JavaScript cell (the wrapper's nested evaluation
    included), and the context's names stay."""
    ctx = sbx.create_code_context(language="js")
    assert sbx.run_code("const kept = 'yes'; 1", context=ctx, timeout=10).text == "1"
    with pytest.raises(e2b.TimeoutException):
        sbx.run_code("while (true) {}", context=ctx, timeout=1)
    assert sbx.run_code("kept", context=ctx, timeout=10).text == "yes"


@pytest.mark.parametrize("op", ["restart", "remove"])
def test_restart_or_remove_stops_a_running_cell(sbx, op: str) -> None:
    ctx = sbx.create_code_context()
    runner, out, _ = _cell_in_thread(sbx, "import time\nprint('running', flush=True)\ntime.sleep(30)", context=ctx)
    started = time.monotonic()
    if op == "restart":
        sbx.restart_code_context(ctx)
    else:
        sbx.remove_code_context(ctx)
    assert sbx.run_code("'free'", timeout=10).text == "'free'"  # the sandbox is usable right away
    assert sbx.commands.run("echo ok", timeout=10).stdout == "ok\n"
    runner.join(10)
    assert not runner.is_alive() and time.monotonic() - started < 10
    error = out["ex"].error
    assert error is not None and error.name == ("ContextRestarted" if op == "restart" else "ContextRemoved")
    if op == "restart":
        assert sbx.run_code("'x' in globals()", context=ctx, timeout=10).text == "False"
        sbx.remove_code_context(ctx)


def test_restart_of_the_default_context_while_busy(sbx) -> None:
    """The reviewer's case: a timed-out cell in the default context, then restart, then commands."""
    with pytest.raises(e2b.TimeoutException):
        sbx.run_code("import time; time.sleep(20)", timeout=1)
    sbx.restart_code_context("default-python")
    started = time.monotonic()
    assert sbx.commands.run("echo ok", timeout=10).stdout == "ok\n"
    assert sbx.run_code("1 + 1", timeout=10).text == "2"
    assert time.monotonic() - started < 10


# -- 2: the last statement's value, IPython's way ---------------------------------------------
def test_last_expression_statement_shows_its_value(sbx) -> None:
    ctx = sbx.create_code_context()
    sbx.run_code("x = 1", context=ctx)
    assert sbx.run_code("x += 1; x", context=ctx).text == "2"
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text.startswith("'/")  # the box's workspace
    assert sbx.run_code("1; 2", context=ctx).text == "2"
    assert sbx.run_code("x;", context=ctx).results == []  # a trailing ';' hides the value
    assert sbx.run_code("x ;  # quiet", context=ctx).results == []
    assert sbx.run_code("if x:\n    x", context=ctx).results == []  # not an expression statement
    assert sbx.run_code("(x +\n 40)", context=ctx).text == "42"
    odd = sbx.run_code("class Odd:\n    def _repr_json_(self):\n        return {1, 2}\n"
                       "    def __repr__(self):\n        return 'odd'\nOdd()", context=ctx)
    assert odd.error is None and odd.text == "odd"  # a repr that cannot travel is left out, as IPython does
    sbx.remove_code_context(ctx)


# -- 3: sys.exit -------------------------------------------------------------------------------
def test_sys_exit_is_a_system_exit_error_and_the_context_lives_on(sbx) -> None:
    ctx = sbx.create_code_context()
    sbx.run_code("kept = 'yes'", context=ctx)
    error = sbx.run_code("import sys; sys.exit(3)", context=ctx).error
    assert (error.name, error.value) == ("SystemExit", "3")
    assert "SystemExit: 3" in error.traceback and "An exception has occurred" in error.traceback  # IPython's
    assert sbx.run_code("import sys\nsys.exit('bye')", context=ctx).error.value == "bye"
    assert sbx.run_code("kept", context=ctx).text == "'yes'"
    sbx.remove_code_context(ctx)


# -- 4: tracebacks show the user's lines -------------------------------------------------------
@pytest.mark.parametrize(("code", "line", "source"), [
    ("1/0", 1, "1/0"),
    ("a = 1\nb = 0\na / b", 3, "a / b"),
    ("x = 1\nraise ValueError('v')\ny = 2", 2, "raise ValueError('v')"),
    ("def f():\n    return {}['k']\nf()", 2, "return {}['k']"),
])
def test_traceback_shows_the_users_own_lines(sbx, code: str, line: int, source: str) -> None:
    error = sbx.run_code(code).error
    assert error is not None
    assert re.search(rf'File "Cell In\[\d+\]", line {line}', error.traceback) and source in error.traceback, \
        error.traceback
    frames = [ln.strip() for ln in error.traceback.splitlines() if ln.strip().startswith("File ")]
    assert frames and all(f.startswith('File "Cell In[') for f in frames), error.traceback  # no driver frame
    assert "__e2b" not in error.traceback and "in main" not in error.traceback, error.traceback


def test_javascript_stack_is_the_cells_own(sbx) -> None:
    error = sbx.run_code("let q = 1;\nthrow new TypeError('bad thing')", language="javascript",
                         envs={"W": "1"}).error
    assert (error.name, error.value) == ("TypeError", "bad thing")
    assert "<cell>:2" in error.traceback and "runInThisContext" not in error.traceback, error.traceback


def test_python_cells_await_at_top_level(sbx) -> None:
    """As in IPython: the last expression may be awaited, and the cell's loop is the context's."""
    assert sbx.run_code("import asyncio\nawait asyncio.sleep(0, 'v')").text == "'v'"
    assert sbx.run_code("q = await asyncio.sleep(0, 3)\nq + 1", envs={"W": "1"}).text == "4"
    error = sbx.run_code("await asyncio.sleep(0)\nraise ValueError('late')").error
    assert (error.name, error.value) == ("ValueError", "late"), error
    assert re.search(r'File "Cell In\[\d+\]", line 2', error.traceback) and "asyncio" not in error.traceback, \
        error.traceback
    # one coroutine: code before the last expression may need the running loop, the last may await
    r = sbx.run_code("fut = asyncio.get_running_loop().create_future()\nfut.set_result(5)\nawait fut")
    assert r.text == "5", (r.text, r.error)


def test_an_earlier_cells_function_shows_its_own_lines(sbx) -> None:
    sbx.run_code("def boom():\n    x = 1\n    return 1 / 0")
    error = sbx.run_code("a = 1\nb = 2\nc = 3\nboom()").error
    assert "    return 1 / 0\n" in error.traceback and "c = 3" not in error.traceback, error.traceback


def test_javascript_cells_await_and_import_with_and_without_envs(sbx) -> None:
    """A cell wrapped for its envs runs through the agent's cell runner as a bare one does."""
    code = "import {sep} from 'node:path';\nconst got = await Promise.resolve(process.env.W || 'none');\n[sep, got]"
    assert sbx.run_code(code, language="javascript", envs={"W": "1"}).text == '["/", "1"]'
    assert sbx.run_code(code, language="javascript").text == '["/", "none"]'
    assert sbx.run_code("got", language="javascript").text == "none"
    error = sbx.run_code("await 1;\nthrow new RangeError('late')", language="javascript", envs={"W": "1"}).error
    assert (error.name, error.value) == ("RangeError", "late") and "<cell>:2" in error.traceback, error.traceback
    # Node's error code is not part of the name or the value
    error = sbx.run_code("require('fs').readFileSync(undefined)", language="javascript").error
    assert error.name == "TypeError" and error.value.startswith('The "path" argument must be'), error


# -- 5: envs -----------------------------------------------------------------------------------
def test_run_envs_reach_bash_python_and_javascript(sbx) -> None:
    r = sbx.run_code("echo $X $SBX_ENV", language="bash", envs={"X": "1"})
    assert r.logs.stdout == ["1 from-create\n"]
    code = "import os; (os.environ.get('X'), os.environ.get('SBX_ENV'))"
    assert sbx.run_code(code, envs={"X": "1"}).text == "('1', 'from-create')"
    assert sbx.run_code("import subprocess; subprocess.run('echo $X', shell=True, capture_output=True).stdout",
                        envs={"X": "child"}).text == "b'child\\n'"
    assert sbx.run_code(code).text == "(None, 'from-create')"  # the run's envs held for that run only
    js = "[process.env.X, process.env.SBX_ENV]"
    assert sbx.run_code(js, language="javascript", envs={"X": "1"}).text == '["1", "from-create"]'
    assert sbx.run_code(js, language="javascript").text == '[null, "from-create"]'
    sbx.run_code("process.env.SBX_ENV = 'changed'", language="javascript")
    assert sbx.run_code("process.env.SBX_ENV", language="javascript").text == "changed"  # set once, at start


def test_bad_envs_are_refused(sbx) -> None:
    with pytest.raises(e2b.SandboxException, match="400"):
        sbx.run_code("1", envs={"A=B": "x"})


# -- 6: a context's cwd ------------------------------------------------------------------------
@pytest.mark.parametrize(("language", "code"), [
    ("python", "import os; (os.getcwd(), open('here.txt').read())"),
    ("javascript", "[process.cwd(), require('fs').readFileSync('here.txt', 'utf8')]"),
])
def test_context_cwd_is_the_cells_directory(sbx, language: str, code: str) -> None:
    sbx.files.write("/home/user/sub/here.txt", "in sub")
    ctx = sbx.create_code_context(cwd="/home/user/sub", language=language)
    assert ctx.cwd == "/home/user/sub"
    text = sbx.run_code(code, context=ctx).text
    assert "/sub'" in text.replace('"', "'") and "in sub" in text, text
    sbx.remove_code_context(ctx)


def test_bash_context_starts_in_its_cwd_and_keeps_cd_exports_and_variables(sbx) -> None:
    sbx.files.write("/home/user/bsub/deeper/f.txt", "x")
    ctx = sbx.create_code_context(cwd="/home/user/bsub", language="bash")
    assert sbx.run_code("pwd", context=ctx).logs.stdout[0].endswith("/bsub\n")  # the box's own path of it
    sbx.run_code("cd deeper && export SBX_ENV=changed && count=2", context=ctx)
    r = sbx.run_code("echo $(pwd) $SBX_ENV $count", context=ctx, envs={"count": "ignored-if-set"})
    assert r.logs.stdout[0].endswith("/bsub/deeper changed ignored-if-set\n")  # a run's envs hold for the run
    assert sbx.run_code("echo $count", context=ctx).logs.stdout == ["2\n"]  # and are put back after it
    failed = sbx.run_code("echo ${nope:?not set}", context=ctx)
    assert failed.error is not None and "not set" in "".join(failed.logs.stderr)
    assert failed.error.value.endswith("not set (exit code 1)"), failed.error
    assert sbx.run_code("echo $count", context=ctx).logs.stdout == ["2\n"]  # the error ended the cell only
    ended = sbx.run_code("exit 3", context=ctx).error
    assert ended.value == "exit code 3; the shell ended, the next cell starts a fresh one", ended
    sbx.run_code("cd deeper && export SBX_ENV=changed && count=2", context=ctx)
    sbx.restart_code_context(ctx)
    out = sbx.run_code("echo $(pwd) $SBX_ENV ${count-none}", context=ctx).logs.stdout
    assert out[0].endswith("/bsub from-create none\n"), out  # a restart starts a fresh shell, with the sandbox's envs
    sbx.remove_code_context(ctx)


def test_default_bash_context_keeps_state_between_cells(sbx) -> None:
    sbx.run_code("greet() { echo hello $1; }; cd /home/user", language="bash")
    assert sbx.run_code("greet $(pwd)", language="bash").logs.stdout == ["hello /home/user\n"]


def test_context_cwd_must_exist(sbx) -> None:
    with pytest.raises(e2b.SandboxException, match="400.*not a directory"):
        sbx.create_code_context(cwd="/home/user/no-such-dir")
    sbx.files.write("/home/user/plain.txt", "x")
    with pytest.raises(e2b.SandboxException, match="400.*not a directory"):
        sbx.create_code_context(cwd="/home/user/plain.txt", language="javascript")
    assert not [c for c in sbx.list_code_contexts() if c.cwd in ("/home/user/no-such-dir", "/home/user/plain.txt")]


# -- 7: output over the cap is cut, and says so ------------------------------------------------
def test_output_over_the_cap_says_it_was_truncated(sbx) -> None:
    ex = sbx.run_code("print('y' * 1_500_000); print('END')")
    assert len("".join(ex.logs.stdout)) == CAP
    notes = [line for line in ex.logs.stderr if "truncated" in line]
    assert notes and f"{CAP} bytes" in notes[0] and "stdout" in notes[0], ex.logs.stderr
    assert ex.error is None
    assert not [line for line in sbx.run_code("print('small')").logs.stderr if "truncated" in line]


# -- the cell driver and the AST policy --------------------------------------------------------
def test_cell_driver_passes_a_strict_policy() -> None:
    """The launcher imports nothing and calls no builtin by name: a provider's AST policy (even one
    blocking os and sys) judges only the user's code, which the interpreter checks itself."""
    every_builtin = [name for name in dir(builtins) if callable(getattr(builtins, name))]  # type, exec, ...
    policy = AstPolicy.from_config(["os", "sys", "builtins", "subprocess"], every_builtin)
    for code in ("x = 1", "x = 1\nx", "y = 2\ny;"):
        policy.check(python_cell(code, {"A": "1"}, "sub", start_env={"B": "2"}))
