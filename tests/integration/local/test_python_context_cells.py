"""A Python context's cell as IPython runs one (agent/py_cells.py): each cell its own file name, so a
traceback through an earlier cell's function shows that cell's lines; a last bare expression as the
result; a `main` that needs arguments only defined; an async `main` on the context's loop. And, for
one-shot runs and cells alike, a module written beside the code imports, as for `python3 -c`."""

import pytest

from .conftest import local_box

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sb():
    with local_box("1g") as s:
        yield s


def ok(r):
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r


def test_a_traceback_shows_each_cells_own_lines(sb):
    ok(sb.run_code("x = 0\ndef g():\n    y = 1\n    return 1 / x", context_id="tb"))
    r = sb.run_code("a = 1\nb = 2\nc = 3\ng()", context_id="tb")
    assert r.exit_code == 1
    assert r.stderr.startswith(
        'Traceback (most recent call last):\n  File "<cell 2>", line 4, in <module>\n    g()\n'
        '  File "<cell 1>", line 4, in g\n    return 1 / x\n'), r.stderr
    assert "c = 3" not in r.stderr, r.stderr


def test_the_last_expression_is_the_result(sb):
    ok(sb.run_code("import asyncio\nrows = [{'n': 1}, {'n': 2}]", context_id="out"))
    assert ok(sb.run_code("len(rows) * 21", context_id="out")).result == 42
    assert ok(sb.run_code("rows", context_id="out")).result == [{"n": 1}, {"n": 2}]
    # one coroutine still: the last expression may await, after code that needs the running loop
    r = ok(sb.run_code("loop = asyncio.get_running_loop()\nawait asyncio.sleep(0, 'slept')", context_id="out"))
    assert r.result == "slept"
    # not JSON: its repr, as IPython shows it
    r = ok(sb.run_code("class P:\n    def __repr__(self):\n        return 'P<1>'\nP()", context_id="out"))
    assert r.result == "P<1>"
    # a ; keeps it from showing; None, a statement or a print show nothing
    for code in ("len(rows);", "None", "y = 5", "print('printed')"):
        r = ok(sb.run_code(code, context_id="out"))
        assert r.result is None, (code, r.result)


def test_a_main_that_needs_arguments_is_only_defined(sb):
    r = ok(sb.run_code("def main(path):\n    return open(path).read()", context_id="main"))
    assert r.result is None and r.stderr == ""
    r = ok(sb.run_code("1", context_id="main", arguments={"path": "/etc/hostname"}))
    assert isinstance(r.result, str)
    # a main without parameters is still called when a cell defines it (the execbox contract)
    assert ok(sb.run_code("def main():\n    return 'called'", context_id="main")).result == "called"


def test_an_async_main_runs_on_the_contexts_loop(sb):
    ok(sb.run_code("import asyncio\nfut = asyncio.get_running_loop().create_future()\nawait asyncio.sleep(0)",
                   context_id="amain"))
    r = sb.run_code("async def main():\n    asyncio.get_running_loop().call_soon(fut.set_result, 'same loop')\n"
                    "    return await fut", context_id="amain")
    assert ok(r).result == "same loop"


def test_a_module_beside_the_code_imports(sb):
    r = ok(sb.run_code("open('beside.py', 'w').write('V = 41\\n')\nimport beside\nprint(beside.V + 1)"))
    assert r.stdout == "42\n"
    ok(sb.run_code("open('beside2.py', 'w').write('W = 7\\n')", context_id="mod"))
    assert ok(sb.run_code("import beside2\nbeside2.W", context_id="mod")).result == 7
