"""The same programs on every provider, with exact expected results (docs/providers.md lists
what each provider declares, generated from capabilities.py; conftest.py runs a declared case as
a strict xfail, so it must fail, and skips only one that would harm the host)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from execbox.errors import (
    FileNotFoundInSandbox,
    InvalidConfigError,
    OutOfMemoryError,
    PathError,
    PayloadTooLargeError,
    SandboxError,
    SessionNotFoundError,
)
from execbox.models import ExecutionResult

from .capabilities import CASES

CAP = 1024 * 1024  # every provider's default stdout/stderr cap


class Box:
    """One instance of the provider under test, with short helpers for the corpus."""

    def __init__(self, provider: Any, name: str) -> None:
        self.p = provider
        self.name = name
        self.instances: list[str] = []

    def new(self, language: str = "python") -> str:
        inst = self.p.create_instance(language, tenant_id="conf", session_id=f"c{len(self.instances)}")
        self.instances.append(inst.instance_id)
        return inst.instance_id

    def run(self, code: str, language: str = "python", *, timeout: float = 20, arguments: Any = None,
            instance: str | None = None, **kw: Any) -> ExecutionResult:
        iid = instance or self.new(language)
        return self.p.execute_code(iid, code, language, timeout, arguments, inline_artifacts=True, **kw)

    def close(self) -> None:
        for iid in self.instances:
            try:
                self.p.destroy_instance(iid)
            except SandboxError:
                pass


@pytest.fixture
def box(conformance_provider) -> Iterator[Box]:
    name, provider = conformance_provider
    b = Box(provider, name)
    yield b
    b.close()


def _ok(r: ExecutionResult) -> ExecutionResult:
    assert r.exit_code == 0 and not r.timed_out and r.error_code is None, (r.exit_code, r.stderr, r.metadata)
    return r


def python_main_arguments(b: Box) -> None:
    r = _ok(b.run("def main(a, b):\n    print('side')\n    return {'sum': a + b, 'items': [a, b, None]}\n",
                  arguments={"a": 2, "b": 40}))
    assert r.result == {"sum": 42, "items": [2, 40, None]}
    assert r.stdout == "side\n"


def python_non_json_result(b: Box) -> None:
    r = b.run("def main():\n    return object()\n", arguments={})
    assert r.exit_code == 1
    assert r.result is None
    assert "not JSON-serializable" in r.stderr


def python_dunder_main_script(b: Box) -> None:
    r = _ok(b.run("def main():\n    print('main called')\n    return 1\n\n"
                  "if __name__ == '__main__':\n    print('script')\n"))
    assert r.stdout == "script\n"
    assert r.result is None


def python_main_called_once(b: Box) -> None:
    r = _ok(b.run("import asyncio\n\nasync def main():\n    print('main called')\n    return 1\n\n"
                  "asyncio.run(main())\n"))
    assert (r.stdout, r.result) == ("main called\n", None)


def python_plain_script(b: Box) -> None:
    for arguments in (None, {}):
        r = _ok(b.run("x = 6 * 7\nprint(x)\n", arguments=arguments))
        assert r.stdout == "42\n" and r.stderr == "" and r.result is None


def javascript_main_arguments(b: Box) -> None:
    r = _ok(b.run("function main(args) {\n  console.log('js');\n  return {n: args.n * 2, s: 'ok'};\n}\n",
                  "javascript", arguments={"n": 21}))
    assert r.result == {"n": 42, "s": "ok"}
    assert r.stdout == "js\n"
    # `{}` names no argument (RAGFlow's /run always sends it): a plain script is no error, as in Python
    for code in ("console.log('plain');", "await null;\nconsole.log('plain');"):
        r = _ok(b.run(code, "javascript", arguments={}))
        assert (r.stdout, r.stderr, r.result) == ("plain\n", "", None), r.stderr


def javascript_es_module(b: Box) -> None:
    r = _ok(b.run("import os from 'node:os';\nconst n = await Promise.resolve(20);\n"
                  "export function main(args) {\n  console.log('esm');\n"
                  "  return {sum: n + args.k, cpus: typeof os.cpus};\n}\n",
                  "javascript", arguments={"k": 22}))
    assert (r.result, r.stdout) == ({"sum": 42, "cpus": "function"}, "esm\n")


def bash_script(b: Box) -> None:
    r = b.run("echo out; echo err >&2; exit 4", "bash")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 4)


def exit_codes_python(b: Box) -> None:
    r = b.run("import sys\nsys.exit(3)")
    assert (r.exit_code, r.timed_out, r.error_code) == (3, False, None), (r.exit_code, r.stderr, r.metadata)


def exit_codes_javascript(b: Box) -> None:
    r = b.run("process.exit(5)", "javascript")
    assert (r.exit_code, r.timed_out, r.error_code) == (5, False, None), (r.exit_code, r.stderr, r.metadata)


def exit_codes_bash(b: Box) -> None:
    r = b.run("exit 7", "bash")
    assert (r.exit_code, r.timed_out, r.error_code) == (7, False, None), (r.exit_code, r.stderr, r.metadata)


def execution_error(b: Box) -> None:
    r = b.run("x = 1\ny = x / 0\n")
    assert r.exit_code == 1 and r.error is not None, (r.exit_code, r.stderr, r.error)
    assert (r.error["name"], r.error["value"]) == ("ZeroDivisionError", "division by zero"), r.error
    assert "y = x / 0" in r.error["traceback"] and "ZeroDivisionError" in r.error["traceback"], r.error
    r = b.run("const a = 1;\nthrow new TypeError('x')", "javascript")
    assert r.exit_code == 1 and r.error is not None, (r.exit_code, r.stderr, r.error)
    assert (r.error["name"], r.error["value"]) == ("TypeError", "x"), r.error
    assert _ok(b.run("print('fine')")).error is None
    assert _ok(b.run("console.log('fine')", "javascript")).error is None


def unicode_output(b: Box) -> None:
    text = "héllo wörld 世界 🎉"
    r = _ok(b.run(f"print({text!r})"))
    assert r.stdout == text + "\n"


def binary_output(b: Box) -> None:
    r = _ok(b.run("import sys\nsys.stdout.buffer.write(b'ok\\xff\\xfe!\\n')\nsys.stdout.flush()"))
    assert r.stdout == "ok\ufffd\ufffd!\n"


def stdout_cap(b: Box) -> None:
    r = b.run("import sys\nsys.stdout.write('x' * (3 * 1024 * 1024))\nprint('END')")
    assert r.truncated is True
    assert CAP - 4096 <= len(r.stdout.encode()) <= CAP + 4096
    assert set(r.stdout[:1000]) == {"x"}


def stderr_cap(b: Box) -> None:
    r = b.run("import sys\nsys.stderr.write('e' * (3 * 1024 * 1024))")
    assert r.truncated is True
    assert CAP - 4096 <= len(r.stderr.encode()) <= CAP + 4096


def timeout(b: Box) -> None:
    started = time.monotonic()
    r = b.run("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.01)\n", timeout=2)
    assert r.timed_out is True
    assert r.error_code == "SB005"
    assert time.monotonic() - started < 20
    assert r.stdout == "started\n", r.stdout  # what the run printed before it was killed comes back


def timeout_sigterm_ignored(b: Box) -> None:
    iid = b.new()
    code = ("import signal, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
            "while True:\\n    open(\"beat\", \"a\").write(\".\")\\n    time.sleep(0.05)'])\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "time.sleep(60)\n")
    r = b.run(code, timeout=2, instance=iid)
    assert r.timed_out and r.error_code == "SB005"
    _assert_stops_growing(b, iid, "beat")


def background_ends_with_run(b: Box) -> None:
    iid = b.new()
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n"
            "    open(\"bg.txt\", \"a\").write(\".\")\\n    time.sleep(0.05)'])\n"
            "time.sleep(0.3)\nprint('started')\n")
    r = _ok(b.run(code, instance=iid))
    assert r.stdout == "started\n"
    _assert_stops_growing(b, iid, "bg.txt")


def daemon_ends_with_timeout(b: Box) -> None:
    iid = b.new()
    code = ("import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        while True:\n            open('daemon.txt', 'a').write('.')\n            time.sleep(0.05)\n"
            "    os._exit(0)\n"
            "time.sleep(60)\n")
    r = b.run(code, timeout=2, instance=iid)
    assert r.timed_out and r.error_code == "SB005"
    _assert_stops_growing(b, iid, "daemon.txt")


def _assert_stops_growing(b: Box, iid: str, path: str) -> None:
    """The file a killed/finished process kept appending to does not grow any more."""
    size = len(b.p.read_bytes(iid, path))
    assert size > 0
    time.sleep(0.6)
    assert len(b.p.read_bytes(iid, path)) == size


def memory_bomb(b: Box) -> None:
    """SB006 either as the run's result (the agent survived) or raised (the OOM took the whole box)."""
    iid = b.new()
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
    try:
        r = b.run(bomb, timeout=30, instance=iid)
    except OutOfMemoryError:
        pass
    else:
        assert r.error_code == "SB006", (r.exit_code, r.stderr[-500:], r.metadata)
        assert r.exit_code != 0
        again = b.p.execute_code(iid, "print('alive')", "python", 20, None)  # the agent survived: box usable
        assert again.stdout == "alive\n"
    assert _ok(b.run("print('next')")).stdout == "next\n"  # and a new instance works


def _fork_bomb(b: Box, language: str, code: str) -> None:
    iid = b.new(language)
    started = time.monotonic()
    try:
        r = b.run(code, language, timeout=5, instance=iid)
    except OutOfMemoryError:
        # The bomb's processes together passed the memory limit before the pids limit (seen under
        # runsc, where each process costs the sandbox kernel memory): the box was killed, which
        # contains it as well. The service must still give a working new instance.
        assert time.monotonic() - started < 30
        assert _ok(b.run("print('next')")).stdout == "next\n"
        return
    assert time.monotonic() - started < 30  # the run ended: the bomb did not hold the box
    # the run itself fails or times out (the bomb never lets it end well), with its SB code
    assert r.timed_out or r.exit_code != 0 or r.error_code == "SB006", (r.exit_code, r.stderr[-500:], r.metadata)
    if r.timed_out:
        assert r.error_code == "SB005", r.metadata
    else:
        assert r.error_code in (None, "SB006"), r.metadata
    after = _ok(b.p.execute_code(iid, "print('fine')", "python", 20, None))  # its tree is gone: forks work
    assert after.stdout == "fine\n"


def fork_bomb_bash(b: Box) -> None:
    # the classic bomb backgrounds itself, so the script then waits (forking `sleep` under the bomb)
    _fork_bomb(b, "bash", ":(){ :|:& };:\nsleep 30")


def fork_bomb_python(b: Box) -> None:
    _fork_bomb(b, "python", "import os, time\nwhile True:\n    try:\n        os.fork()\n"
                            "    except OSError:\n        time.sleep(0.01)\n")


def artifacts(b: Box) -> None:
    r = _ok(b.run("import os\nos.makedirs('artifacts', exist_ok=True)\n"
                  "open('artifacts/report.txt', 'w').write('numbers: 1 2 3\\n')\n"
                  "open('artifacts/raw.bin', 'wb').write(bytes(range(256)))\n"))
    by_name = {a.name: a for a in r.artifacts}
    assert set(by_name) == {"report.txt", "raw.bin"}
    assert by_name["report.txt"].read_bytes() == b"numbers: 1 2 3\n"
    raw = by_name["raw.bin"]
    assert raw.size == 256 and raw.sha256 == hashlib.sha256(bytes(range(256))).hexdigest()
    assert raw.read_bytes() == bytes(range(256))


def plots(b: Box) -> None:
    r = _ok(b.run("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                  "plt.plot([1, 2, 3], [3, 1, 2])\n", timeout=60))
    pngs = [a for a in r.artifacts if a.mime_type == "image/png"]
    assert len(pngs) == 1
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def file_operations(b: Box) -> None:
    iid = b.new()
    b.p.write_file(iid, "dir/a.txt", "one\ntwo\nthree\n")
    b.p.write_file(iid, "dir/b.bin", bytes([0, 1, 2, 255]))
    page = b.p.read_file(iid, "dir/a.txt", 1, 1)
    assert page.content == "two\n" and page.total_lines == 3
    assert b.p.read_bytes(iid, "dir/b.bin") == bytes([0, 1, 2, 255])
    assert {f.path for f in b.p.list_files(iid, "dir")} == {"dir/a.txt", "dir/b.bin"}
    assert b.p.glob(iid, "**/*.txt") == ["dir/a.txt"]
    hits = b.p.grep(iid, "^thr", ".", None, 10)
    assert [(m.path, m.line_number, m.line) for m in hits] == [("dir/a.txt", 3, "three")]
    r = _ok(b.p.execute_code(iid, "print(open('dir/a.txt').read().split())", "python", 20, None))
    assert r.stdout == "['one', 'two', 'three']\n"


BIG_LINES = 9_000_000  # 76 MB of `seq` text: over the 64 MiB of one read (agent/fileops.MAX_READ_BYTES)
WRITE_BIG = f"""
import os
with open('big.log', 'w') as f:
    for start in range(1, {BIG_LINES} + 1, 100000):
        f.write(''.join(f'{{i}}\\n' for i in range(start, min(start + 100000, {BIG_LINES} + 1))))
os.makedirs('many')
for i in range(5):
    open(f'many/{{i}}.txt', 'w').write('x\\n')
open('blob.bin', 'wb').write(b'\\0\\1 needle \\xff')
print(os.path.getsize('big.log'))
"""


def file_search_and_size(b: Box) -> None:
    iid = b.new()
    size = int(_ok(b.p.execute_code(iid, WRITE_BIG, "python", 30, None)).stdout)
    assert size > 64 * 1024 * 1024
    hits = b.p.grep(iid, "^1234567$", "big.log", None, 10)
    assert [(m.path, m.line_number, m.line) for m in hits] == [("big.log", 1234567, "1234567")]
    assert hits.truncated is False and hits.binary_matches == [] and hits.skipped == []
    capped = b.p.grep(iid, "^x$", "many", None, 3)
    assert len(capped) == 3 and capped.truncated is True
    assert b.p.grep(iid, "needle", ".", "*.bin", 10).binary_matches == ["blob.bin"]
    paths = b.p.glob(iid, "many/*", 3)
    assert paths == ["many/0.txt", "many/1.txt", "many/2.txt"] and paths.truncated is True
    assert b.p.glob(iid, "many/*", 5).truncated is False
    page = b.p.read_file(iid, "big.log", BIG_LINES - 2, 10)
    assert page.content == f"{BIG_LINES - 1}\n{BIG_LINES}\n" and page.total_lines == BIG_LINES
    piece = b.p.read_bytes(iid, "big.log", offset=18, length=6)
    assert piece == b"10\n11\n" and piece.offset == 18 and piece.total_size == size
    with pytest.raises(PayloadTooLargeError) as e:
        b.p.read_bytes(iid, "big.log")
    assert e.value.details["size"] == size and e.value.details["limit"] == 64 * 1024 * 1024


def path_traversal_refused(b: Box) -> None:
    iid = b.new()
    _ok(b.p.execute_code(iid, "import os\nos.symlink('/etc', 'outside')\nos.symlink('../..', 'up')", "python", 20,
                         None))
    for bad in ("../x", "/etc/passwd", "a/../../b", "outside/passwd", "up/etc/passwd", "nul\x00byte"):
        with pytest.raises(PathError):
            b.p.read_bytes(iid, bad)
        with pytest.raises(PathError):
            b.p.write_file(iid, bad, "x")


def python_contexts(b: Box) -> None:
    iid = b.new()
    _ok(b.p.execute_code(iid, "import asyncio\ntotal = await asyncio.sleep(0, 40)", "python", 20, None, context_id="a"))
    r = _ok(b.p.execute_code(iid, "total += 2\nprint(total)", "python", 20, None, context_id="a"))
    assert r.stdout == "42\n"
    other = b.p.execute_code(iid, "print(total)", "python", 20, None, context_id="b")
    assert other.exit_code != 0 and "NameError" in other.stderr


def bash_contexts(b: Box) -> None:
    iid = b.new("bash")
    _ok(b.p.execute_code(iid, "mkdir -p d && cd d && n=40 && f() { echo $((n + $1)); }", "bash", 20, None,
                         context_id="s"))
    failed = b.p.execute_code(iid, "echo ${missing:?is not set}", "bash", 20, None, context_id="s")
    assert failed.exit_code != 0 and "is not set" in failed.stderr
    r = _ok(b.p.execute_code(iid, "f 2; basename $PWD", "bash", 20, None, context_id="s"))
    assert r.stdout == "42\nd\n"
    other = _ok(b.p.execute_code(iid, "echo ${n-none}", "bash", 20, None, context_id="t"))
    assert other.stdout == "none\n"


def javascript_contexts(b: Box) -> None:
    iid = b.new("javascript")
    _ok(b.p.execute_code(iid, "const total = await Promise.resolve(40)", "javascript", 20, None, context_id="a"))
    r = _ok(b.p.execute_code(iid, "import {sep} from 'node:path';\nconst total2 = total + 2;\nconsole.log(sep, total2)",
                             "javascript", 20, None, context_id="a"))
    assert r.stdout == "/ 42\n"
    r = _ok(b.p.execute_code(iid, "const total = 1; total", "javascript", 20, None, context_id="a"))
    assert r.result == 1
    other = b.p.execute_code(iid, "total", "javascript", 20, None, context_id="b")
    assert other.exit_code != 0 and "total is not defined" in other.stderr


def context_interrupt(b: Box) -> None:
    for language, state, busy, probe in (
        ("python", "kept = 'yes'", "while True:\n    pass", "print(kept)"),
        ("javascript", "var kept = 'yes'", "while (true) {}", "console.log(kept)"),
    ):
        iid = b.new(language)
        _ok(b.p.execute_code(iid, state, language, 20, None, context_id="i"))
        r = b.p.execute_code(iid, busy, language, 1, None, context_id="i")
        assert r.timed_out and r.error_code == "SB005" and "context_reset" not in r.metadata, (language, r.metadata)
        assert "its state is kept" in r.metadata["context_note"], r.metadata
        assert _ok(b.p.execute_code(iid, probe, language, 20, None, context_id="i")).stdout == "yes\n", language


def invalid_requests(b: Box) -> None:
    """SB002 before anything runs: an unknown language, a timeout that is not a positive number;
    the instance is still usable after them."""
    iid = b.new()
    with pytest.raises(InvalidConfigError) as e:
        b.p.execute_code(iid, "print(1)", "ruby", 20, None)
    assert e.value.code == "SB002" and not isinstance(e.value, SessionNotFoundError), e.value
    for bad in (0, -1):
        with pytest.raises(InvalidConfigError) as e:
            b.p.execute_code(iid, "print(1)", "python", bad, None)
        assert e.value.code == "SB002" and not isinstance(e.value, SessionNotFoundError), e.value
    assert _ok(b.p.execute_code(iid, "print('still')", "python", 20, None)).stdout == "still\n"


def unknown_instance(b: Box) -> None:
    """A run on an instance that never existed is SessionNotFoundError (404)."""
    iid = b.new()
    with pytest.raises(SessionNotFoundError) as e:
        b.p.execute_code(iid + "-nosuch", "print(1)", "python", 20, None)
    assert e.value.http_status == 404


def destroyed_instance(b: Box) -> None:
    """A run on an instance just destroyed is SessionNotFoundError (404): nothing runs it any more."""
    iid = b.new()
    _ok(b.p.execute_code(iid, "print(1)", "python", 20, None))
    b.p.destroy_instance(iid)
    try:
        r = b.p.execute_code(iid, "print(1)", "python", 20, None)
    except SessionNotFoundError as e:
        assert e.http_status == 404
    else:
        raise AssertionError(f"a run on a destroyed instance did not raise SessionNotFoundError: {r.stdout!r}")


def missing_file(b: Box) -> None:
    """Reading a path that does not exist is FileNotFoundInSandbox (404), not an empty file."""
    iid = b.new()
    for read in (lambda: b.p.read_bytes(iid, "no/such.txt"), lambda: b.p.read_file(iid, "nosuch.txt")):
        with pytest.raises(FileNotFoundInSandbox) as e:
            read()
        assert e.value.http_status == 404


def instances_isolated(b: Box) -> None:
    """A file one instance writes is not in another instance of the same provider."""
    first, second = b.new(), b.new()
    _ok(b.p.execute_code(first, "open('mine.txt', 'w').write('first')", "python", 20, None))
    seen = "import os\nprint(os.path.exists('mine.txt'))"
    assert _ok(b.p.execute_code(second, seen, "python", 20, None)).stdout == "False\n"
    assert _ok(b.p.execute_code(first, seen, "python", 20, None)).stdout == "True\n"  # not vacuous


CORPUS: dict[str, Callable[[Box], None]] = {name: globals()[name] for name in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_conformance(box: Box, case: str) -> None:
    try:
        CORPUS[case](box)
    except SandboxError as e:
        where = e.details.get("traceback")  # an agent bug's reply carries where it happened
        if where:
            raise AssertionError(f"{e}\nin the agent:\n{where}") from e
        raise


def test_every_case_has_a_program() -> None:
    assert set(CORPUS) == set(CASES)


def test_capability_table_in_docs_is_generated_from_the_declarations() -> None:
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("gen_capabilities", os.path.join(root, "scripts",
                                                                                   "gen_capabilities.py"))
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(os.path.join(root, "docs", "providers.md"), encoding="utf-8") as f:
        assert f.read() == gen.render(), "docs/providers.md is stale: run scripts/gen_capabilities.py"
