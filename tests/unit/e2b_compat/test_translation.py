"""The E2B facade's pure translations: paths, cells, error lines, command lines."""

from __future__ import annotations

import re

import pytest

from execbox.service.e2b_compat.cells import DISPLAY_KEY, display_result, error_from_stderr, python_cell
from execbox.service.e2b_compat.envd_gen.process import process_pb as pb
from execbox.service.e2b_compat.envd_process import shell_command
from execbox.service.e2b_compat.workspace import PathRefused, to_e2b, to_workspace


@pytest.mark.parametrize(("given", "rel"), [
    ("/home/user", "."), ("/home/user/", "."), ("~", "."), ("~/a.txt", "a.txt"), ("/home/user/d/x.bin", "d/x.bin"),
    ("rel/p.txt", "rel/p.txt"), ("./a/../b", "b"), ("/home/user/a/./b", "a/b"),
])
def test_paths_map_into_the_workspace(given: str, rel: str) -> None:
    assert to_workspace(given) == rel
    assert to_workspace(to_e2b(rel)) == rel


@pytest.mark.parametrize("bad", ["/etc/passwd", "/home/userx/a", "/home/user/../../etc", "../x", "", "a\0b", "/tmp"])
def test_paths_outside_the_workspace_are_refused(bad: str) -> None:
    with pytest.raises(PathRefused):
        to_workspace(bad)


def _run_cell(code: str, globs: dict) -> object:
    """What the agent does with a cell program: exec, then call main() unless a __main__ guard."""
    import ast

    from execbox.agent import py_cells
    from execbox.agent.runners import has_main_guard

    py_cells.install()  # as a context does: the driver runs its cells through the agent's runner
    program = python_cell(code)
    guarded = has_main_guard(ast.parse(program))
    globs.setdefault("__name__", "__main__")
    exec(compile(program, "<cell>", "exec"), globs)  # noqa: S102 - test of our own transform
    main = globs.get("main")
    return main() if (not guarded and callable(main)) else None


def test_cell_value_and_user_main_preserved() -> None:
    g: dict = {}
    assert _run_cell("x = 2\nx * 21", g) == {DISPLAY_KEY: {"text": "42"}}
    assert "main" not in g and "__e2b_saved_main" not in g
    assert _run_cell("def main():\n    return 'mine'", g) is None  # defined, not called
    assert _run_cell("main() + '!'", g) == {DISPLAY_KEY: {"text": "'mine!'"}}
    assert g["main"]() == "mine"  # the user's main survives the display main
    assert _run_cell("y = 1", g) is None


def test_cell_edge_cases() -> None:
    assert _run_cell("a = 1; a", {}) == {DISPLAY_KEY: {"text": "1"}}  # the last statement, as IPython
    assert _run_cell("a = 1; a;", {}) is None  # a trailing ";" hides it, as in IPython
    assert python_cell("print(1)\nx = 3").endswith('if __name__ == "__main__":\n    pass\n')


def test_a_cell_that_does_not_parse_is_reported_in_its_cell_name(capsys) -> None:
    """As a runtime error is: `Cell In[N]`, IPython's name (sent as written, the agent called it
    `<cell N>`)."""
    from execbox.agent import py_cells

    py_cells.take_reported()
    with pytest.raises(SystemExit):
        _run_cell("x = 1\ndef broken(:", {})
    assert capsys.readouterr().err == ""  # the traceback is the error only (as a kernel sends it)
    err = py_cells.take_reported()[1]
    assert re.search(r'File "Cell In\[\d+\]", line 2\n    def broken\(:\n', err), err
    assert err.rstrip().endswith("SyntaxError: invalid syntax") and "<cell" not in err, err


def test_a_failed_cell_hands_its_exception_and_traceback_to_the_agent(capsys) -> None:
    """The run's error is the agent's (py_cells.report -> runners.error_of), not read back from stderr."""
    from execbox.agent import py_cells, runners

    py_cells.take_reported()
    with pytest.raises(SystemExit):
        _run_cell("print('before', file=__import__('sys').stderr)\nraise ValueError('a\\nb')", {})
    e, text = py_cells.take_reported()
    err = capsys.readouterr().err
    assert runners.error_of(e, text) == {"name": "ValueError", "value": "a\nb", "traceback": text}
    assert text.startswith("Traceback") and "before" not in text and err == "before\n"  # not echoed
    with pytest.raises(SystemExit):
        _run_cell("import sys; sys.exit(3)", {})
    e, text = py_cells.take_reported()
    assert (type(e).__name__, str(e)) == ("SystemExit", "3")
    assert text.startswith("An exception has occurred") and text.endswith("SystemExit: 3\n")


def test_display_and_errors() -> None:
    assert display_result(None) is None
    assert display_result({DISPLAY_KEY: {"text": "1", "html": "<b>1</b>", "evil": "x"}}) == {
        "type": "result", "is_main_result": True, "text": "1", "html": "<b>1</b>"}
    assert display_result({"a": 1})["json"] == {"a": 1}
    tb = 'Traceback (most recent call last):\n  File "<cell>", line 1\nZeroDivisionError: division by zero\n'
    assert error_from_stderr(tb, "python") == {"name": "ZeroDivisionError", "value": "division by zero",
                                               "traceback": tb}
    node = "/tmp/x.js:1\nthrow new TypeError('bad')\n^\n\nTypeError: bad\n    at Object.<anonymous>\n"
    assert error_from_stderr(node, "javascript")["name"] == "TypeError"


def test_command_lines_are_never_interpolated() -> None:
    sdk = pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "echo $HOME | wc -c"])
    assert shell_command(sdk) == "echo $HOME | wc -c"  # E2B's own shell form: the user's command line
    argv = pb.ProcessConfig(cmd="python3", args=["-c", "print(1)", "; rm -rf /"])
    assert shell_command(argv) == "python3 -c 'print(1)' '; rm -rf /'"
