"""A remote background command's handle keeps at most a held run's output cap of each stream
(review 31, F2: ``commands.run("yes", background=True)`` grew the client to 1 GiB): the head of
each stream, ``truncated`` set, while ``on_output`` still gets every chunk. Driven by a fake of
the service's process reads, sync and async."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from execbox.sdk import process_handles
from execbox.sdk.process_handles import AsyncProcessHandle, ProcessHandle

CAP = process_handles.KEPT_OUTPUT
CHUNK = "x" * (300 * 1024) + "é\n"  # a two-byte character, so the cut must land on a whole one
CHUNKS = 12  # ~3.6 MiB of stdout in all


class FakeOps:
    """The reads a chatty process gives: CHUNKS reads of stdout (and a little stderr), then its end."""

    def __init__(self, chunks: int = CHUNKS) -> None:
        self.reads = 0
        self.chunks = chunks

    def _answer(self, out_off: int, err_off: int) -> dict[str, Any]:
        self.reads += 1
        running = self.reads <= self.chunks
        out = CHUNK if running else ""
        err = "warn\n" if running else ""
        return {"stdout": out, "stderr": err, "running": running, "status": "running" if running else "exited",
                "exit_code": None if running else 0, "signal": None, "timed_out": False,
                "stdout_offset": out_off + len(out.encode()), "stderr_offset": err_off + len(err),
                "started_at": 1.0, "ended_at": None if running else 2.0}

    def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int, wait: float) -> dict[str, Any]:
        return self._answer(stdout_offset, stderr_offset)

    def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"pid": pid}


class AsyncFakeOps(FakeOps):
    async def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int,  # type: ignore[override]
                            wait: float) -> dict[str, Any]:
        await asyncio.sleep(0)
        return self._answer(stdout_offset, stderr_offset)

    async def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {"pid": pid}


def _check(seen: list[tuple[str, str]], stdout: str, stderr: str, truncated: bool) -> None:
    assert sum(len(t) for s, t in seen if s == "stdout") == CHUNKS * len(CHUNK)  # the callback got it all
    kept = stdout.encode()
    assert CAP - 1 <= len(kept) <= CAP  # the head, cut on a whole character
    assert stdout == (CHUNK * CHUNKS)[: len(stdout)]
    assert truncated is True
    assert stderr == "warn\n" * CHUNKS  # a stream under the cap is whole


def test_a_background_process_keeps_at_most_the_cap_and_says_truncated() -> None:
    seen: list[tuple[str, str]] = []
    h = ProcessHandle(FakeOps(), 7, lambda s, t: seen.append((s, t)))  # type: ignore[arg-type]
    res = h.wait(timeout=30)
    _check(seen, res.stdout, res.stderr, res.truncated)
    assert h.truncated and h.stdout == res.stdout and res.exit_code == 0


def test_the_cap_holds_while_the_process_runs() -> None:
    class Chatty(FakeOps):
        """40 reads (~12 MiB) before the end; at the last one, what the running handle holds."""
        handle: ProcessHandle | None = None
        while_running: tuple[int, bool, bool] | None = None

        def _answer(self, out_off: int, err_off: int) -> dict[str, Any]:
            if self.reads == self.chunks:
                assert ready.wait(10) and self.handle is not None
                self.while_running = (len(self.handle.stdout.encode()), self.handle.truncated, self.handle.running)
            return super()._answer(out_off, err_off)

    ready = threading.Event()
    ops = Chatty(40)
    ops.handle = ProcessHandle(ops, 8, None)  # type: ignore[arg-type]
    ready.set()
    ops.handle.wait(timeout=30)
    assert ops.while_running is not None
    size, truncated, running = ops.while_running
    assert size <= CAP and truncated and running


def test_the_async_handle_keeps_at_most_the_cap_too() -> None:
    async def go() -> None:
        seen: list[tuple[str, str]] = []
        h = AsyncProcessHandle(AsyncFakeOps(), 9, lambda s, t: seen.append((s, t)))  # type: ignore[arg-type]
        res = await h.wait(timeout=30)
        _check(seen, res.stdout, res.stderr, res.truncated)
        assert h.truncated

    asyncio.run(go())
