"""A Python program in a box behaves as ``python3 program.py`` would (review 24): ``main()`` runs
once, whoever calls it; the command line is the program's, not the agent's; threads, thread pools
and ``atexit`` finish before the run ends; a program's own ``MemoryError`` is its error, not an
OOM; numpy-style values ``main()`` returns are JSON. The same agent runs in every self-hosted box."""

import pytest

from .conftest import local_box

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sb():
    with local_box("512m") as s:
        yield s


@pytest.mark.parametrize("code", [
    "def main():\n    print('in main')\n    return 7\nmain()",
    "def main(path):\n    print('in main', path)\nmain('data.csv')",
    "import asyncio\nasync def main():\n    print('in main')\nasyncio.run(main())",
    "import threading\ndef main():\n    print('in main')\nt = threading.Thread(target=main)\nt.start(); t.join()",
])
def test_a_program_that_calls_main_itself_runs_it_once(sb, code):
    r = sb.run_code(code)
    assert (r.stdout.count("in main"), r.stderr, r.exit_code) == (1, "", 0), r


def test_main_the_program_only_defines_is_called_and_an_async_one_is_awaited(sb):
    r = sb.run_code("def main():\n    print('in main')\n    return [1, 2]")
    assert (r.stdout, r.result) == ("in main\n", [1, 2])
    r = sb.run_code("import asyncio\nasync def main():\n    await asyncio.sleep(0)\n    return {'a': 1}")
    assert (r.result, r.stderr, r.exit_code) == ({"a": 1}, "", 0)


def test_a_contexts_main_runs_in_the_cell_that_defines_it_not_in_every_later_cell(sb):
    r = sb.run_code("def main():\n    print('report written')\n    return 'ok'", context_id="m")
    assert (r.stdout, r.result) == ("report written\n", "ok")
    r = sb.run_code("print('just checking')", context_id="m")
    assert (r.stdout, r.result) == ("just checking\n", None)
    r = sb.run_code("def main():\n    return 'redefined'", context_id="m")
    assert r.result == "redefined"
    assert sb.run_code("pass", context_id="m", arguments={}).result == "redefined"  # asked for: called


def test_the_command_line_is_the_programs_not_the_agents(sb):
    code = ("import argparse, sys\np = argparse.ArgumentParser()\np.add_argument('--n', type=int, default=3)\n"
            "print(p.parse_args().n, sys.argv, sys.orig_argv[1:])")
    r = sb.run_code(code)
    assert (r.stdout, r.exit_code) == ("3 ['<code>'] ['<code>']\n", 0), r.stderr
    r = sb.run_code("import sys; sys.argv = ['prog', '--n', '5']", context_id="argv")
    assert sb.run_code("import sys; print(sys.argv)", context_id="argv").stdout == "['prog', '--n', '5']\n"


def test_threads_pools_and_atexit_finish_before_the_run_ends(sb):
    code = ("import atexit, threading, time\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
            "ThreadPoolExecutor(2).submit(lambda: (time.sleep(0.3), print('task done')))\n"
            "threading.Thread(target=lambda: time.sleep(60), daemon=True).start()\n"
            "print('body')")
    r = sb.run_code(code, timeout=20)
    assert r.stdout.splitlines()[0] == "body" and r.exit_code == 0 and not r.timed_out
    assert sorted(r.stdout.splitlines()[1:3]) == ["task done", "thread done"] and r.stdout.endswith("atexit ran\n")


def test_a_programs_own_memory_error_is_its_error_and_a_failed_allocation_is_sb006(sb):
    r = sb.run_code("def f():\n    raise MemoryError('cache budget of 10 MB exceeded')\nf()")
    assert r.exit_code == 1 and r.error_code is None
    assert 'line 2, in f' in r.stderr and r.stderr.endswith("MemoryError: cache budget of 10 MB exceeded\n")
    r = sb.run_code("def grow():\n    return bytearray(2 * 1024**3)\ngrow()")
    assert r.error_code == "SB006" and "line 2, in grow" in r.stderr and r.stderr.endswith("MemoryError\n")


def test_values_with_tolist_are_returned_as_json(sb):
    r = sb.run_code("import array\ndef main():\n"
                    "    return {'a': array.array('i', [1, 2]), 'n': array.array('d', [0.5])}")
    assert (r.result, r.exit_code) == ({"a": [1, 2], "n": [0.5]}, 0), r.stderr
    r = sb.run_code("def main():\n    return object()")
    assert r.exit_code == 1 and "not JSON-serializable (object)" in r.stderr


def test_a_context_that_exits_reports_its_own_exit_code_not_a_kill(sb):
    """review 24: os._exit(4) in a context read as exit -9, signal 9 (an OOM kill, to an agent)."""
    sb.run_code("x = 1", context_id="exits")
    r = sb.run_code("import os\nprint('bye', flush=True)\nos._exit(4)", context_id="exits")
    assert (r.stdout, r.exit_code, r.metadata.get("signal")) == ("bye\n", 4, None), r
    assert "ended (exit code 4)" in r.metadata["context_note"] and r.error_code is None
    r = sb.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", context_id="exits")
    assert (r.exit_code, r.metadata.get("signal")) == (-15, 15) and "killed by signal 15" in r.metadata["context_note"]
    assert sb.run_code("print(x)", context_id="exits").exit_code == 1  # a fresh context: x is gone


def test_a_context_cells_peak_memory_is_its_own():
    """review 24: a context's lifetime peak was repeated on every later cell."""
    with local_box("1g") as s:
        big = s.run_code("x = bytearray(300 * 1024**2)\nx[::4096] = b'1' * len(x[::4096])\ndel x", context_id="m")
        small = s.run_code("print(1)", context_id="m")
    assert big.metadata["peak_memory_kb"] > 300 * 1024
    assert small.metadata["peak_memory_kb"] < 150 * 1024, (big.metadata["peak_memory_kb"], small.metadata)


def test_a_timeout_while_waiting_for_threads_says_so(sb):
    """Waiting for non-daemon threads is python3's exit; a run that times out there says what it
    was waiting for, not only that it timed out."""
    code = ("import threading, time\n"
            "threading.Thread(target=lambda: time.sleep(60), name='server').start()\nprint('started')")
    r = sb.run_code(code, timeout=2)
    assert r.timed_out and r.stdout == "started\n" and r.error_code == "SB005"
    message = r.metadata["error_message"]
    assert "waiting for its non-daemon threads" in message and "server" in message, message
    r = sb.run_code("import time\ntime.sleep(60)", timeout=1)  # its own code ran out of time
    assert r.timed_out and r.metadata["error_message"] == "execution timed out; the process tree was killed"
