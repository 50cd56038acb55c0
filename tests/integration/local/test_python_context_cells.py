"""A Python context's cell as IPython runs one (agent/py_cells.py): it may `await` at top level, on
the context's one event loop, which later cells share; each cell has its own file name, so a
traceback through an earlier cell's function shows that cell's lines; a last bare expression is the
result; a `main` that needs arguments is only defined; an async `main` runs on the context's loop.
A one-shot run is a file `python3` runs, where top-level `await` stays a SyntaxError. And, for
one-shot runs and cells alike, a module written beside the code imports, as for `python3 -c`."""

import pytest

pytestmark = pytest.mark.timeout(120)


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
    for code in ("len(rows);", "len('ééé');", "None", "y = 5", "print('printed')"):
        r = ok(sb.run_code(code, context_id="out"))
        assert r.result is None, (code, r.result)
    assert ok(sb.run_code("len('ééé')  # ;;", context_id="out")).result == 3  # a ; in a comment hides nothing


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


def test_a_cell_awaits_and_keeps_its_names(sb):
    ok(sb.run_code("import asyncio\nawait asyncio.sleep(0)\nx = await asyncio.sleep(0, 5)", context_id="a"))
    assert ok(sb.run_code("print(x)", context_id="a")).stdout == "5\n"


def test_later_cells_share_the_event_loop(sb):
    # a future belongs to the loop that made it: awaiting it on another loop fails
    ok(sb.run_code("import asyncio\nq = asyncio.Queue()\nfut = asyncio.get_running_loop().create_future()\n"
                   "await q.put('kept')", context_id="loop"))
    r = sb.run_code("asyncio.get_running_loop().call_soon(fut.set_result, await q.get())\nprint(await fut)",
                    context_id="loop")
    assert ok(r).stdout == "kept\n"
    # asyncio.run() in a cell (its own loop, then none set) does not end the context's
    assert ok(sb.run_code("async def g():\n    return 7\nprint(asyncio.run(g()))", context_id="loop")).stdout == "7\n"
    assert ok(sb.run_code("await q.put(1)\nprint(await q.get())\nawait q.put(2)", context_id="loop")).stdout == "1\n"
    # and it is the current loop again for a cell's synchronous code
    r = sb.run_code("print(asyncio.get_event_loop().run_until_complete(q.get()))", context_id="loop")
    assert ok(r).stdout == "2\n"


def test_an_awaiting_cells_traceback_is_the_codes_own(sb):
    r = sb.run_code("import asyncio\nawait asyncio.sleep(0)\n1 / 0", context_id="err")
    assert r.exit_code == 1
    assert r.stderr.startswith('Traceback (most recent call last):\n  File "<cell 1>", line 3'), r.stderr
    assert "asyncio" not in r.stderr and "runners" not in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero"), r.stderr
    assert ok(sb.run_code("print('alive')", context_id="err")).stdout == "alive\n"


def test_arguments_call_main_after_an_awaiting_cell(sb):
    r = sb.run_code("import asyncio\nbase = await asyncio.sleep(0, 2)\ndef main(n):\n    return n * base",
                    context_id="args", arguments={"n": 21})
    assert r.exit_code == 0 and r.result == 42, (r.result, r.stderr)


def test_a_one_shot_run_is_a_file_where_await_is_a_syntax_error(sb):
    r = sb.run_code("import asyncio\nawait asyncio.sleep(0)")
    assert r.exit_code == 1 and "SyntaxError: 'await' outside function" in r.stderr, r.stderr


def test_an_interrupted_awaiting_cell_does_not_go_on_in_later_cells(sb):
    r = sb.run_code("import asyncio\nticks = 0\nwhile True:\n    await asyncio.sleep(0.1)\n    ticks += 1",
                    context_id="ticks", timeout=1)
    assert r.timed_out and "its state is kept" in r.metadata["context_note"], r.metadata
    assert "py_cells" not in r.stderr and r.stderr.rstrip().endswith("KeyboardInterrupt"), r.stderr
    r = sb.run_code("before = ticks\nawait asyncio.sleep(0.5)\nprint(before == ticks, len(asyncio.all_tasks()))",
                    context_id="ticks")
    assert ok(r).stdout == "True 1\n"  # its task was cancelled: nothing but this cell's own runs
