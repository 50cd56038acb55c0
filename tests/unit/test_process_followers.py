"""The two followers of background processes, against a scripted agent: the HTTP API's
(service/background.py, a buffer read by offsets) and the E2B facade's (e2b_compat/envd_bg.py, an
event stream). Both poll until the process ends, take the output of its last poll, kill it at its
deadline, report a lost box, retry a busy agent and audit the end with one rule (``end_status``);
the HTTP API's also stops taking output while a stream holds ``HOLD`` unread bytes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from execbox.errors import ProviderUnavailableError, SandboxError, SessionNotFoundError
from execbox.service import background
from execbox.service.background import BgProcess, ProcessTable
from execbox.service.e2b_compat import envd_bg
from execbox.service.executions import RunSpec

Step = Callable[["FakeBox"], None] | BaseException


def write(out: bytes = b"", err: bytes = b"") -> Step:
    def step(box: FakeBox) -> None:
        box.out += out
        box.err += err
    return step


def end(code: int = 0, signal: int | None = None, out: bytes = b"") -> Step:
    def step(box: FakeBox) -> None:
        box.out += out
        box.exit = {"exit_code": -signal if signal else code, "signal": signal}
    return step


class FakeBox:
    """A provider with one agent background process: each poll first plays the next scripted step
    (more output, the end, an error); like the agent, the end is reported once all output is read."""

    name = "fake"

    def __init__(self, *script: Step, chunk: int = 1 << 20) -> None:
        self.script = list(script)
        self.chunk = chunk
        self.out, self.err = bytearray(), bytearray()
        self.exit: dict[str, Any] | None = None
        self.polls: list[tuple[int, int]] = []
        self.signals: list[str] = []
        self.lock = threading.Lock()

    def poll_process(self, instance_id: str, pid: int, out_off: int, err_off: int) -> dict[str, Any]:
        with self.lock:
            self.polls.append((out_off, err_off))
            if self.script:
                step = self.script.pop(0)
                if isinstance(step, BaseException):
                    raise step
                step(self)
            out = bytes(self.out[out_off:out_off + self.chunk])
            err = bytes(self.err[err_off:err_off + self.chunk])
            done = self.exit is not None and out_off + len(out) == len(self.out) and err_off + len(err) == len(self.err)
            return {"stdout": out, "stderr": err, "exited": done, **(self.exit if done else {})}

    def signal_process(self, instance_id: str, pid: int, signal: str = "SIGKILL") -> bool:
        with self.lock:
            self.signals.append(signal)
            if self.exit is None:
                self.exit = {"exit_code": -9, "signal": 9}
            return True

    def instance_alive(self, instance_id: str) -> bool:
        return True


class Runs:
    """RunService.record only: the audit rows, (status, exit_code, error_code)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int | None, str | None]] = []
        self.done = threading.Event()

    def record(self, spec: RunSpec, provider: str, instance_id: str | None, started: float, status: str,
               exit_code: int | None, error_code: str | None = None) -> None:
        self.rows.append((status, exit_code, error_code))
        self.done.set()

    def wait(self) -> tuple[str, int | None, str | None]:
        assert self.done.wait(10), "the follower did not end"
        assert len(self.rows) == 1
        return self.rows[0]


SPEC = RunSpec("t", "s", "background_command", "bash", "cmd", None, None)  # type: ignore[arg-type]


def native(box: FakeBox, timeout: float | None = None) -> tuple[ProcessTable, BgProcess, Runs]:
    runs = Runs()
    table = ProcessTable(runs, 8)  # type: ignore[arg-type]
    p = BgProcess(7, "cmd", None, "t", "s", box, "i1", False, timeout)  # type: ignore[arg-type]
    table.add(p, SPEC)
    return table, p, runs


@dataclass
class FakeProc:
    """envd_process.Proc as the E2B follower sees it: publish() collects the events."""

    provider: FakeBox
    instance_id: str = "i1"
    pid: int = 7
    pty: bool = False
    events: list[Any] = field(default_factory=list)
    budget: Any = None
    tenant: str = "t"

    def publish(self, event: Any) -> None:
        self.events.append(event)

    def reserve(self, want: int) -> int:
        return want if self.budget is None else self.budget.take(self.tenant, want)

    def backlog(self) -> int:
        return 0

    def wait_drained(self, timeout: float) -> None:
        time.sleep(timeout)

    def data(self) -> list[tuple[str, bytes]]:
        return [(e.event.value.output.field, e.event.value.output.value) for e in self.events[:-2]]

    def end(self) -> Any:
        assert self.events[-1] is None and self.events[-2].event.field == "end"
        return self.events[-2].event.value


def e2b(box: FakeBox, timeout: float = 60, pty: bool = False) -> tuple[FakeProc, Runs, threading.Event]:
    runs, forgot = Runs(), threading.Event()
    proc = FakeProc(box, pty=pty)
    envd_bg.start_follower(SimpleNamespace(runs=runs), None, proc, time.monotonic() + timeout, SPEC, forgot.set)
    return proc, runs, forgot


# -- both followers --------------------------------------------------------------------------------

def test_output_of_the_last_poll_and_the_exit_code() -> None:
    script = (write(b"one "), write(err=b"warn\n"), end(3, out=b"two\n"))
    _, p, runs = native(FakeBox(*script))
    assert runs.wait() == ("failed", 3, None)
    got = p.read(0, 0)
    assert (got["stdout"], got["stderr"]) == (b"one two\n", b"warn\n")
    assert p.info()["status"] == "exited" and p.info()["exit_code"] == 3
    proc, runs, forgot = e2b(FakeBox(*script))
    assert runs.wait() == ("failed", 3, None) and forgot.wait(5)
    assert proc.data() == [("stdout", b"one "), ("stderr", b"warn\n"), ("stdout", b"two\n")]
    e = proc.end()
    assert (e.exit_code, e.exited, e.status) == (3, True, "exit status 3")


def test_a_clean_exit_is_a_success_and_pty_output_is_pty_data() -> None:
    _, p, runs = native(FakeBox(end(0, out=b"ok")))
    assert runs.wait() == ("success", 0, None) and p.read(0, 0)["stdout"] == b"ok"
    proc, runs, _ = e2b(FakeBox(write(b"$ ", b"e"), end(0)), pty=True)
    assert runs.wait() == ("success", 0, None)
    assert proc.data() == [("pty", b"$ "), ("stderr", b"e")] and proc.end().status == "exit status 0"


def test_the_deadline_kills_the_job_and_the_end_is_a_timeout() -> None:
    box = FakeBox(write(b"started\n"))
    _, p, runs = native(box, timeout=0.3)
    assert runs.wait() == ("timeout", -9, "SB005") and box.signals == ["SIGKILL"]
    info = p.info()
    assert (info["status"], info["timed_out"], info["signal"]) == ("timed_out", True, 9)
    assert p.read(0, 0)["stdout"] == b"started\n"
    box = FakeBox(write(b"started\n"))
    proc, runs, _ = e2b(box, timeout=0.3)
    assert runs.wait() == ("timeout", -9, "SB005") and box.signals == ["SIGKILL"]
    e = proc.end()
    assert (e.exit_code, e.exited, e.status, e.error) == (-1, False, "timeout", "command timed out")


@pytest.mark.parametrize(("sig", "name"), [(9, "killed"), (15, "terminated")])
def test_a_signalled_end_is_cancelled(sig: int, name: str) -> None:
    _, p, runs = native(FakeBox(write(b"x"), end(signal=sig)))
    assert runs.wait() == ("cancelled", -sig, None)
    assert (p.info()["status"], p.info()["signal"]) == ("signalled", sig)
    proc, runs, _ = e2b(FakeBox(write(b"x"), end(signal=sig)))
    assert runs.wait() == ("cancelled", -sig, None)
    assert (proc.end().status, proc.end().error, proc.end().exited) == (f"signal: {name}", name, False)


def test_a_busy_agent_is_asked_again_without_loss() -> None:
    busy = SandboxError("busy", details={"busy": True})
    script = (write(b"a"), busy, write(b"b"), busy, end(0, out=b"c"))
    _, p, runs = native(FakeBox(*script))
    assert runs.wait() == ("success", 0, None) and p.read(0, 0)["stdout"] == b"abc"
    proc, runs, _ = e2b(FakeBox(*script))
    assert runs.wait() == ("success", 0, None)
    assert b"".join(d for _, d in proc.data()) == b"abc"


def test_a_lost_box_ends_the_process_with_an_error() -> None:
    gone = SessionNotFoundError("no such session")
    for err, native_why, e2b_why in (
            (gone, "the box no longer knows process 7", "the sandbox was killed"),
            (ProviderUnavailableError("box died"), "the process was lost with its box (SB009: box died)",
             "SB009: box died"),
            (RuntimeError("boom"), "following the process failed: RuntimeError", "boom")):
        _, p, runs = native(FakeBox(write(b"x"), err))
        assert runs.wait() == ("error", None, None)
        info = p.info()
        assert (info["status"], info["error"], info["running"]) == ("lost", native_why, False)
        assert p.read(0, 0)["stdout"] == b"x"
        proc, runs, forgot = e2b(FakeBox(write(b"x"), err))
        assert runs.wait() == ("error", None, None) and forgot.is_set()
        e = proc.end()
        assert (e.status, e.error, e.exit_code) == ("error", e2b_why, -1) and proc.data() == [("stdout", b"x")]


# -- the HTTP API's buffer -------------------------------------------------------------------------

def test_a_full_buffer_stops_taking_output_until_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "HOLD", 8)
    data = bytes(range(65, 65 + 40))
    box = FakeBox(write(data), chunk=5)
    _, p, runs = native(box)
    deadline = time.monotonic() + 5
    while len(box.polls) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert len(p.out.buf) == 10 and max(o for o, _ in box.polls) == 10  # full: the rest stays in the box
    got, off, deadline = b"", 0, time.monotonic() + 10
    while len(got) < len(data) and time.monotonic() < deadline:
        r = p.read(off, 0)  # acknowledges what lies before off: the follower takes more
        got, off = got + r["stdout"], r["stdout_offset"]
        assert len(p.out.buf) <= 8 + 5
        time.sleep(0.01)
    assert got == data and not runs.done.is_set()
    box.signal_process("i1", 7)
    assert runs.wait() == ("cancelled", -9, None)


def test_the_end_is_taken_with_its_output_while_the_buffer_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "HOLD", 4)
    _, p, runs = native(FakeBox(write(b"12345"), end(0, out=b"6")))
    assert runs.wait() == ("success", 0, None)
    assert p.read(0, 0)["stdout"] == b"123456" and p.info()["status"] == "exited"


def test_a_forgotten_process_is_no_longer_followed() -> None:
    table, p, runs = native(FakeBox(write(b"x")))
    time.sleep(0.05)
    with table._lock:
        table._procs.clear()  # its session's box changed
    assert runs.wait() == ("error", None, None)
    assert (p.info()["status"], p.info()["error"]) == ("lost", "the session's box changed")
