"""Review 17's E2B findings, through the official SDK against a real `execbox serve` (jail):
out-of-range timeouts are refused (not capped), stdin to a process without it is
FAILED_PRECONDITION, and a watcher records every event from its creation on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, module_sandbox

e2b = pytest.importorskip("e2b")

MAX = 86400
Ev = e2b.FilesystemEventType


@pytest.fixture(scope="module")
def sbx(e2b_server: Server) -> Iterator[object]:
    with module_sandbox(e2b_server, lambda: e2b.Sandbox.create(timeout=300, metadata={"suite": "envd-fixes"})) as sb:
        yield sb


def _lifetime(sb) -> float:
    info = sb.get_info()
    return (info.end_at - info.started_at).total_seconds()


def test_a_timeout_over_the_maximum_is_refused_not_capped(e2b_env: Server) -> None:
    mine = e2b.SandboxQuery(metadata={"purpose": "too-long"})
    with pytest.raises(e2b.SandboxException, match=r"400: Timeout cannot be greater than 24 hours \(86400"):
        e2b.Sandbox.create(timeout=MAX + 1, metadata={"purpose": "too-long"})
    assert e2b.Sandbox.list(query=mine).next_items() == []  # refused before a box started
    sb = e2b.Sandbox.create(timeout=MAX, metadata={"purpose": "too-long"})  # the maximum itself is fine
    try:
        assert abs(_lifetime(sb) - MAX) < 60
        sb.set_timeout(60)
        with pytest.raises(e2b.SandboxException, match="400: Timeout cannot be greater than 24 hours"):
            sb.set_timeout(200000)
        assert _lifetime(sb) < 600  # left as it was, not moved to the maximum
        with pytest.raises(e2b.SandboxException, match="400: Timeout cannot be greater than 24 hours"):
            e2b.Sandbox.connect(sb.sandbox_id, timeout=100000)
        assert _lifetime(sb) < 600
        e2b.Sandbox.connect(sb.sandbox_id, timeout=MAX)
        assert _lifetime(sb) > MAX - 60
        # the older resume route: the timeout is checked first (400), then the state (409: running)
        url, key = f"{e2b_env.url}/sandboxes/{sb.sandbox_id}/resume", {"X-API-KEY": e2b_env.token_a}
        r = httpx.post(url, headers=key, json={"timeout": MAX + 1}, timeout=30)
        assert (r.status_code, r.json()["code"]) == (400, 400) and "24 hours" in r.json()["message"], r.text
        assert httpx.post(url, headers=key, json={"timeout": MAX}, timeout=30).status_code == 409
    finally:
        sb.kill()


def test_stdin_to_a_process_without_it_is_failed_precondition(sbx) -> None:
    quiet = sbx.commands.run("sleep 30", background=True)  # stdin not asked for
    try:
        with pytest.raises(e2b.SandboxException) as err:
            sbx.commands.send_stdin(quiet.pid, "x")
        assert "FAILED_PRECONDITION" in str(err.value) and "stdin not enabled or closed" in str(err.value)
        assert "ALREADY_EXISTS" not in str(err.value)
    finally:
        sbx.commands.kill(quiet.pid)
    reader = sbx.commands.run("cat; sleep 30", background=True, stdin=True)
    try:
        sbx.commands.send_stdin(reader.pid, "one\n")
        sbx.commands.close_stdin(reader.pid)
        with pytest.raises(e2b.SandboxException, match="FAILED_PRECONDITION: stdin not enabled or closed"):
            sbx.commands.send_stdin(reader.pid, "two\n")  # closed: the same answer
    finally:
        sbx.commands.kill(reader.pid)


# Each step lands in the watched directory whole (mv from a staging directory, or one append), and
# steps are 0.7 s apart: more than the 200 ms poll, so each is seen on its own.
STEPS = ("mkdir -p stage w && printf 1 > stage/a && mv stage/a w/a.txt; sleep 0.7; "
         "printf 22 >> w/a.txt; sleep 0.7; mv w/a.txt w/b.txt; sleep 0.7; rm w/b.txt; sleep 0.7; "
         "printf x > stage/t && mv stage/t w/t.txt; sleep 0.7; rm w/t.txt; sleep 0.7")
EXPECTED = [("a.txt", Ev.CREATE), ("a.txt", Ev.WRITE), ("a.txt", Ev.RENAME), ("b.txt", Ev.CREATE),
            ("b.txt", Ev.REMOVE), ("t.txt", Ev.CREATE), ("t.txt", Ev.REMOVE)]


def test_a_watcher_records_every_event_from_its_creation(sbx) -> None:
    """Nothing is polled while the steps run: one get_new_events afterwards returns them all, in
    order (a diff at that moment would see nothing: every file is gone again)."""
    sbx.files.make_dir("w")
    handle = sbx.files.watch_dir("w")
    try:
        sbx.commands.run(STEPS)
        time.sleep(0.5)
        got = [(e.name, e.type) for e in handle.get_new_events()]
        assert got == EXPECTED, got
        assert handle.get_new_events() == []  # taken: the buffer is empty now
        sbx.files.write("w/later.txt", "x")
        deadline, later = time.monotonic() + 5, []
        while not later and time.monotonic() < deadline:
            time.sleep(0.25)
            later = [(e.name, e.type) for e in handle.get_new_events()]
        assert later == [("later.txt", Ev.CREATE)]
    finally:
        handle.stop()


def test_watch_dir_streams_renames_too(e2b_server: Server, sbx) -> None:
    """The async SDK's streamed watch_dir runs the same poll loop."""
    async def watch() -> list[tuple[str, object]]:
        peer = await e2b.AsyncSandbox.connect(sbx.sandbox_id, api_key=e2b_server.token_a,
                                              api_url=e2b_server.url, sandbox_url=e2b_server.url)
        await peer.files.make_dir("aw")
        seen: list[tuple[str, object]] = []
        handle = await peer.files.watch_dir("aw", on_event=lambda e: seen.append((e.name, e.type)))
        try:
            await peer.commands.run(STEPS.replace(" w/", " aw/").replace("stage w", "stage aw"))
            await asyncio.sleep(0.5)
        finally:
            await handle.stop()
        return seen

    assert asyncio.run(watch()) == EXPECTED


def test_watchers_are_capped_and_removing_one_frees_its_place(sbx) -> None:
    sbx.files.make_dir("capped")
    handles = []
    try:
        with pytest.raises(e2b.RateLimitException, match="watchers"):
            for _ in range(100):
                handles.append(sbx.files.watch_dir("capped"))
        assert len(handles) == 16
        handles.pop().stop()
        handles.append(sbx.files.watch_dir("capped"))  # its place is free again
    finally:
        for h in handles:
            h.stop()


def test_a_watcher_never_resumes_a_paused_sandbox(e2b_env: Server) -> None:
    """The watcher's loop lists the box without taking the session, so it never starts a paused
    sandbox's box again; once the sandbox runs again it goes on recording."""
    sb = e2b.Sandbox.create(timeout=120)
    try:
        sb.files.make_dir("pw")
        handle = sb.files.watch_dir("pw")
        assert sb.pause() is True
        time.sleep(1.5)  # several poll turns while paused
        assert sb.get_info().state == e2b.SandboxState.PAUSED
        again = e2b.Sandbox.connect(sb.sandbox_id)
        again.files.write("pw/after.txt", "x")
        deadline, got = time.monotonic() + 5, []
        while not got and time.monotonic() < deadline:
            time.sleep(0.25)
            got = [(e.name, e.type) for e in handle.get_new_events()]
        assert got == [("after.txt", Ev.CREATE)]
        handle.stop()
    finally:
        sb.kill()
