"""A Python context's cell may `await` at top level, as in IPython and Jupyter: the cell runs on the
context's one event loop, which later cells share. A one-shot run is a file run by `python3`,
where top-level `await` stays a SyntaxError."""

import pytest

from .conftest import local_box

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sb():
    with local_box("1g") as s:
        yield s


def ok(r):
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.stdout


def test_a_cell_awaits_and_keeps_its_names(sb):
    ok(sb.run_code("import asyncio\nawait asyncio.sleep(0)\nx = await asyncio.sleep(0, 5)", context_id="a"))
    assert ok(sb.run_code("print(x)", context_id="a")) == "5\n"


def test_later_cells_share_the_event_loop(sb):
    # a future belongs to the loop that made it: awaiting it on another loop fails
    ok(sb.run_code("import asyncio\nq = asyncio.Queue()\nfut = asyncio.get_running_loop().create_future()\n"
                   "await q.put('kept')", context_id="loop"))
    r = sb.run_code("asyncio.get_running_loop().call_soon(fut.set_result, await q.get())\nprint(await fut)",
                    context_id="loop")
    assert ok(r) == "kept\n"
    # asyncio.run() in a cell (its own loop, then none set) does not end the context's
    assert ok(sb.run_code("async def g():\n    return 7\nprint(asyncio.run(g()))", context_id="loop")) == "7\n"
    assert ok(sb.run_code("await q.put(1)\nprint(await q.get())\nawait q.put(2)", context_id="loop")) == "1\n"
    # and it is the current loop again for a cell's synchronous code
    assert ok(sb.run_code("print(asyncio.get_event_loop().run_until_complete(q.get()))", context_id="loop")) == "2\n"


def test_an_awaiting_cells_traceback_is_the_codes_own(sb):
    r = sb.run_code("import asyncio\nawait asyncio.sleep(0)\n1 / 0", context_id="err")
    assert r.exit_code == 1
    assert r.stderr.startswith('Traceback (most recent call last):\n  File "<cell 1>", line 3'), r.stderr
    assert "asyncio" not in r.stderr and "runners" not in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero"), r.stderr
    assert ok(sb.run_code("print('alive')", context_id="err")) == "alive\n"


def test_arguments_call_main_after_an_awaiting_cell(sb):
    r = sb.run_code("import asyncio\nbase = await asyncio.sleep(0, 2)\ndef main(n):\n    return n * base",
                    context_id="args", arguments={"n": 21})
    assert r.exit_code == 0 and r.result == 42, (r.result, r.stderr)


def test_a_one_shot_run_is_a_file_where_await_is_a_syntax_error(sb):
    r = sb.run_code("import asyncio\nawait asyncio.sleep(0)")
    assert r.exit_code == 1 and "SyntaxError: 'await' outside function" in r.stderr, r.stderr
