"""A failed cell's ``execution.error`` is the one execbox's agent reports (name, value and the
traceback as the cell printed it), not a reading of its stderr: a message of several lines is
whole, and what the cell printed on stderr before it failed stays in ``logs.stderr`` only."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from .conftest import Server, module_sandbox

ci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: ci.Sandbox.create(timeout=300)) as sandbox:
        yield sandbox


def test_python_error_is_the_agents(sbx) -> None:
    ex = sbx.run_code("import sys\nprint('NotMine: decoy', file=sys.stderr)\nraise ValueError('first\\nsecond')")
    assert (ex.error.name, ex.error.value) == ("ValueError", "first\nsecond"), ex.error
    assert ex.error.traceback.startswith("Traceback (most recent call last):\n"), ex.error.traceback
    assert 'File "Cell In[' in ex.error.traceback and "decoy" not in ex.error.traceback, ex.error.traceback
    # the traceback is the error only, as a Jupyter kernel sends it: stderr has what the cell printed
    assert ex.logs.stderr == ["NotMine: decoy\n"], ex.logs.stderr
    ex = sbx.run_code("print('hello'); import sys; print('warn', file=sys.stderr); 1/0")
    assert (ex.logs.stdout, ex.logs.stderr) == (["hello\n"], ["warn\n"]), ex.logs
    assert ex.error.name == "ZeroDivisionError" and "1/0" in ex.error.traceback, ex.error
    ex = sbx.run_code("import sys; sys.exit(3)")
    assert (ex.error.name, ex.error.value, ex.logs.stderr) == ("SystemExit", "3", []), ex
    assert sbx.run_code("1 + 1").error is None


def test_javascript_error_is_the_agents(sbx) -> None:
    if shutil.which("node") is None:
        pytest.skip("node (JavaScript runtime) not installed")
    ex = sbx.run_code("console.error('NotMine: decoy');\nthrow new RangeError('first\\nsecond')", language="javascript")
    assert (ex.error.name, ex.error.value) == ("RangeError", "first\nsecond"), ex.error
    assert "<cell>:2" in ex.error.traceback and "decoy" not in ex.error.traceback, ex.error.traceback


def test_javascript_floating_rejection_is_its_cells_error(sbx) -> None:
    if shutil.which("node") is None:
        pytest.skip("node (JavaScript runtime) not installed")
    ex = sbx.run_code("Promise.reject(new Error('float')); 7", language="javascript")
    assert ex.error is not None and (ex.error.name, ex.error.value) == ("Error", "float"), ex
    assert ex.error.traceback.endswith("\n"), ex.error.traceback
    ex = sbx.run_code("8", language="javascript")
    assert (ex.error, ex.logs.stderr, ex.text) == (None, [], "8"), ex
    ex = sbx.run_code("throw null", language="javascript")
    assert (ex.error.name, ex.error.value) == ("null", "null"), ex.error


def _stderr(ex) -> str:
    return "".join(ex.logs.stderr)


def test_javascript_error_is_not_on_stderr_too(sbx) -> None:
    """As a Python cell's: the error is ``execution.error`` only; ``logs.stderr`` holds what the
    cell wrote itself (a console.error before the throw), never the stack again."""
    if shutil.which("node") is None:
        pytest.skip("node (JavaScript runtime) not installed")
    for envs in (None, {"W": "1"}):
        ex = sbx.run_code("console.error('said before');\nfunction f() { throw new RangeError('bad range') }\nf()",
                          language="javascript", envs=envs)
        assert (ex.error.name, ex.error.value) == ("RangeError", "bad range"), ex.error
        assert "RangeError: bad range" in ex.error.traceback and "at f (<cell>:2:" in ex.error.traceback, ex.error
        assert _stderr(ex) == "said before\n", (envs, ex.logs.stderr)
    # an async cell: an awaited rejection, and a rejected promise as the cell's value
    ex = sbx.run_code("await null;\nconsole.error('waited');\nawait Promise.reject(new TypeError('awaited'))",
                      language="javascript")
    assert (ex.error.name, ex.error.value, _stderr(ex)) == ("TypeError", "awaited", "waited\n"), ex
    assert "<cell>:3" in ex.error.traceback, ex.error.traceback
    ex = sbx.run_code("console.error('x');\n(async () => { await null; throw new Error('rejected') })()",
                      language="javascript")
    assert (ex.error.name, ex.error.value, _stderr(ex)) == ("Error", "rejected", "x\n"), ex
    assert "<cell>:2" in ex.error.traceback, ex.error.traceback
    # a rejection nobody handled, raised before the cell answers, is its error: not printed either
    ex = sbx.run_code("Promise.reject(new Error('floating')); 7", language="javascript")
    assert (ex.error.name, ex.error.value, _stderr(ex)) == ("Error", "floating", ""), ex
    # what is thrown need not be an Error
    ex = sbx.run_code("console.error('n');\nthrow 42", language="javascript")
    assert (ex.error.name, ex.error.value, ex.error.traceback, _stderr(ex)) == ("Number", "42", "42\n", "n\n"), ex
    # a cell that does not parse
    ex = sbx.run_code("let a = 1;\nlet b = ;", language="javascript")
    assert (ex.error.name, _stderr(ex)) == ("SyntaxError", ""), ex
    assert ex.error.traceback.startswith("<cell>:2\nlet b = ;\n"), ex.error.traceback
    # a block is a block (not an object literal that fails to parse), wrapped as every cell is
    assert sbx.run_code("{ let blk = 5; blk }", language="javascript").text == "5"
    # the context lives on, and a cell that fails nothing has neither
    ex = sbx.run_code("console.error('fine'); [1, 2].length", language="javascript")
    assert (ex.error, ex.text, _stderr(ex)) == (None, "2", "fine\n"), ex
