"""The SDK's four sandboxes share one surface: ``files``, ``commands`` (foreground and background
handles with wait/kill) and ``run_code``. Sandbox/AsyncSandbox run on the real jail provider;
RemoteSandbox/AsyncRemoteSandbox on a real execbox service (uvicorn on loopback) over that jail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import execbox
from execbox import (
    AsyncCommandHandle,
    AsyncRemoteSandbox,
    AsyncSandbox,
    CommandHandle,
    ExecutionTimeoutError,
    RemoteSandbox,
    Sandbox,
)

from .conftest import Service

TICKER = "echo start; for i in $(seq 1 600); do echo $i >> tick.txt; sleep 0.05; done; echo never"


def _until(check: Callable[[], bool], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture(params=["Sandbox", "RemoteSandbox"])
def sb(request: pytest.FixtureRequest, jail_provider: Any, service: Service) -> Iterator[Any]:
    if request.param == "Sandbox":
        box: Any = Sandbox.create(jail_provider, tenant_id="sdk")
    else:
        box = RemoteSandbox.create(service.url, service.tenant_a)
    with box:
        yield box


def test_everything_is_exported_from_the_package_root() -> None:
    for name in ("Sandbox", "AsyncSandbox", "RemoteSandbox", "AsyncRemoteSandbox", "CommandHandle",
                 "AsyncCommandHandle", "execute_code", "get_sandbox"):
        assert name in execbox.__all__ and getattr(execbox, name).__module__.startswith("execbox.sdk.")


def test_files_run_code_and_foreground_commands(sb: Any) -> None:
    sb.files.write("d/data.txt", "hello")
    assert sb.run_code("print(open('d/data.txt').read())").stdout == "hello\n"
    assert [f.path for f in sb.files.list("d")] == ["d/data.txt"]
    res = sb.commands.run("cat d/data.txt; echo err >&2; exit 4", cwd=".")
    assert (res.stdout, res.stderr, res.exit_code) == ("hello", "err\n", 4)


def test_background_command_streams_and_waits(sb: Any) -> None:
    """The command runs on until the test writes ``release`` (at most a minute), so it is still
    running while the test looks, however slow the machine is."""
    wait_for_release = "i=0; while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    h = sb.commands.run(f"echo hi; {wait_for_release}; echo bye >&2; exit 3", background=True)
    assert isinstance(h, CommandHandle)
    _until(lambda: h.stdout == "hi\n")
    assert h.running and h.exit_code is None
    with pytest.raises(ExecutionTimeoutError):
        h.wait(timeout=0.01)
    sb.files.write("release", "")
    res = h.wait()
    assert (res.exit_code, res.stdout, res.stderr) == (3, "hi\n", "bye\n")
    assert (h.exit_code, h.stdout, h.stderr, h.running) == (3, "hi\n", "bye\n", False)


def test_killing_a_background_command_stops_its_process_and_frees_the_sandbox(sb: Any) -> None:
    h = sb.commands.run(TICKER, background=True, timeout=120)
    _until(lambda: "start" in h.stdout)
    started = time.monotonic()
    res = h.kill()
    assert time.monotonic() - started < 10
    assert res.metadata["killed"] is True and res.exit_code != 0 and "never" not in res.stdout
    assert h.exit_code == res.exit_code
    assert sb.commands.run("echo after").stdout == "after\n"  # the box is usable again
    ticks = sb.files.read("tick.txt").content
    time.sleep(0.5)
    assert sb.files.read("tick.txt").content == ticks, "the killed loop is still writing"


@pytest.mark.parametrize("kind", ["AsyncSandbox", "AsyncRemoteSandbox"])
def test_async_twins_have_the_same_namespaces(kind: str, jail_provider: Any, service: Service) -> None:
    async def go() -> None:
        if kind == "AsyncSandbox":
            box: Any = await AsyncSandbox.create(jail_provider, tenant_id="sdk")
        else:
            box = await AsyncRemoteSandbox.create(service.url, service.tenant_a)
        async with box as sb:
            await sb.files.write("a.txt", "async")
            assert (await sb.run_code("print(open('a.txt').read())")).stdout == "async\n"
            assert (await sb.commands.run("cat a.txt")).stdout == "async"
            h = await sb.commands.run("echo one; sleep 0.3; exit 2", background=True)
            assert isinstance(h, AsyncCommandHandle)
            res = await h.wait()
            assert (res.exit_code, res.stdout, h.exit_code) == (2, "one\n", 2)
            h = await sb.commands.run(TICKER, background=True, timeout=120)
            for _ in range(300):
                if "start" in h.stdout:
                    break
                await asyncio.sleep(0.05)
            assert h.running
            res = await h.kill()
            assert res.metadata["killed"] is True and "never" not in res.stdout and not h.running
            assert (await sb.commands.run("echo after")).stdout == "after\n"
            ticks = (await sb.files.read("tick.txt")).content
            await asyncio.sleep(0.5)
            assert (await sb.files.read("tick.txt")).content == ticks, "the killed loop is still writing"

    # A fresh thread: another suite's sync Playwright may own this thread's running event loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def test_files_work_while_code_runs(sb: Any) -> None:
    """A run waiting for a file is released by a write through ``files``: file operations go to
    the box beside the run instead of queueing behind it."""
    code = "import os, time\nwhile not os.path.exists('go.txt'):\n    time.sleep(0.05)\nprint(open('go.txt').read())"
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(sb.run_code, code, timeout=30)  # if the write never comes, the run ends here
        time.sleep(0.5)
        sb.files.write("note.txt", "beside")
        assert "note.txt" in [f.path for f in sb.files.list(".")]
        assert not run.done()  # those two did not wait for the run
        sb.files.write("go.txt", "released")
        assert run.result(timeout=30).stdout == "released\n"
