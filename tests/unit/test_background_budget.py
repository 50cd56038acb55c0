"""What background processes may cost the service (service/follower.py ``Budget``, used by
service/background.py and e2b_compat/envd_bg.py), against the scripted agent of
test_process_followers: held output stays within the per-tenant and service-wide budgets and
nothing is lost (it waits in the box until a read frees room); an ended process nobody reads keeps
only the tail of its unread output, and says how much it dropped; one that ended in the box while
its output waited skips to that tail; a tenant runs at most so many processes (429 SB008); a quiet
process is polled rarely unless a client reads it; an E2B stream that does not keep up holds the
output back instead of queueing it without bound."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from execbox.errors import InvalidConfigError, RateLimitError
from execbox.service import background, bg_follower, follower
from execbox.service.background import BgProcess, ProcessTable
from execbox.service.config import ServiceSettings
from execbox.service.e2b_compat import envd_bg
from execbox.service.e2b_compat.envd_gen.process import process_pb as pb
from tests.unit.test_process_followers import SPEC, FakeBox, Runs, end, write


class Box(FakeBox):
    """The agent's poll also says whether the process ended in the box, with the streams' sizes."""

    def poll_process(self, instance_id: str, pid: int, out_off: int, err_off: int) -> dict[str, Any]:
        v = super().poll_process(instance_id, pid, out_off, err_off)
        with self.lock:
            return {**v, "ended": self.exit is not None, "stdout_size": len(self.out), "stderr_size": len(self.err)}


def table(**limits: Any) -> tuple[ProcessTable, Runs]:
    runs = Runs()
    return ProcessTable(runs, 8, ServiceSettings(**limits)), runs  # type: ignore[arg-type]


def start(t: ProcessTable, box: FakeBox, pid: int = 7, tenant: str = "t", session: str = "s") -> BgProcess:
    p = BgProcess(pid, "cmd", None, tenant, session, box, "i1", False, None)  # type: ignore[arg-type]
    t.add(p, SPEC)
    return p


def until(check: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def read_all(p: BgProcess, seconds: float = 20) -> tuple[bytes, bytes]:
    out = err = b""
    deadline = time.monotonic() + seconds
    while True:
        r = p.read(len(out), len(err))
        out, err = out + r["stdout"], err + r["stderr"]
        if not p.info()["running"] and not r["stdout"] and not r["stderr"]:
            return out, err
        assert time.monotonic() < deadline, "the process did not end"
        time.sleep(0.005)


# -- held bytes --------------------------------------------------------------------------------------

def test_a_tenant_holds_at_most_its_budget_and_loses_nothing() -> None:
    t, runs = table(tenant_background_hold_bytes=300, background_hold_bytes=10_000)
    data1, data2 = bytes(range(256)) * 8, bytes(reversed(range(256))) * 8  # 2 KiB each, in 100-byte polls
    b1, b2 = Box(write(data1, data1[:500]), chunk=100), Box(write(data2), chunk=100)
    p1, p2 = start(t, b1, 7), start(t, b2, 8, session="s2")
    p2.read(0, 0)  # a client reads it (later): its output is kept for it, to the end
    time.sleep(0.5)  # nobody reads on: both fill the tenant's budget, then stop taking output
    assert t.budget.held("t") == 300 == p1.held + p2.held
    assert max(o for o, _ in b1.polls + b2.polls) < 400  # the rest waits in the box
    b1.script.append(end(0))
    b2.script.append(end(3))
    got1, got2 = read_all(p1), read_all(p2)  # reads free room: the followers take the rest
    assert got1 == (data1, data1[:500]) and got2 == (data2, b"")
    assert p1.read(0, 0)["stdout_dropped"] == 0 and p2.info()["exit_code"] == 3
    assert t.budget.held("t") == 0 and t.budget.running("t") == 0


def test_the_service_wide_budget_bounds_all_tenants_together() -> None:
    t, _ = table(tenant_background_hold_bytes=1000, background_hold_bytes=250, tenant_background_floor_bytes=0)
    boxes = [Box(write(b"x" * 3000), chunk=64) for _ in range(3)]
    procs = [start(t, box, 7 + i, tenant=f"t{i}") for i, box in enumerate(boxes)]
    time.sleep(0.5)
    assert t.budget.held() == 250 == sum(p.held for p in procs)
    while t.budget.held():  # acknowledge everything held: the budget is free again
        for p in procs:
            p.read(p.out.end, 0)
        time.sleep(0.05)
        if all(p.out.end == 3000 for p in procs):
            break
    assert all(p.out.end == 3000 for p in procs)  # every byte went through the 250-byte budget
    for box in boxes:
        box.signal_process("i1", 7)


MiB = 1 << 20


def test_a_tenant_gets_its_floor_while_others_fill_the_shared_budget() -> None:
    budget = follower.Budget(256 * MiB, 64 * MiB, 8, 4 * MiB)
    for tenant in "ABCDE":
        budget.admit(tenant)
    for tenant in "ABCD":  # four tenants fill their own budgets, and so the shared one
        assert budget.take(tenant, 100 * MiB) == 64 * MiB
    assert budget.held() == 256 * MiB and budget.room("A") == 0
    assert budget.room("E") == 4 * MiB  # was 0: E's output stalled until A..D's clients read
    assert budget.take("E", 3 * MiB) == 3 * MiB and budget.take("E", 3 * MiB) == 1 * MiB
    assert budget.take("E", 1) == 0 and budget.take("A", 1) == 0  # the floor, no more
    assert budget.take("F", 1) == 0  # a tenant running nothing has no floor
    assert budget.held() == 260 * MiB <= budget.hold_bytes + budget.tenant_floor_bytes * 5
    budget.charge("E", -4 * MiB)  # E's client reads: its floor is free again
    assert budget.take("E", 5 * MiB) == 4 * MiB
    budget.charge("A", -64 * MiB)  # A's client reads: the shared part is free again
    assert budget.take("E", 100 * MiB) == 60 * MiB  # E up to its own budget
    assert budget.held() == 256 * MiB


def test_the_floors_keep_the_total_within_hold_plus_a_floor_per_holding_tenant() -> None:
    import random

    rnd = random.Random(7)
    hold, tenant_hold, floor = 10_000, 3_000, 400
    budget = follower.Budget(hold, tenant_hold, 8, floor)
    tenants = [f"t{i}" for i in range(40)]
    running: set[str] = set()
    for _ in range(20_000):
        tenant = rnd.choice(tenants)
        if tenant not in running and rnd.random() < 0.5:
            budget.admit(tenant)
            running.add(tenant)
        elif rnd.random() < 0.7:
            held = budget.held(tenant)
            want = rnd.randint(1, 900)
            got = budget.take(tenant, want)
            assert 0 <= got <= min(want, max(0, tenant_hold - held))
            if tenant in running:  # up to its floor whatever the others hold
                assert got >= min(want, floor - held)
        else:
            budget.charge(tenant, -rnd.randint(0, budget.held(tenant)))
            if tenant in running and rnd.random() < 0.2:
                budget.leave(tenant)
                running.discard(tenant)
        holding = sum(1 for t in tenants if budget.held(t))
        assert budget.held() <= hold + floor * holding
        assert all(budget.held(t) <= tenant_hold for t in tenants)
    assert budget.held() > hold  # the floors were used on top of the shared budget


def test_a_tenant_reads_all_its_output_while_others_fill_the_shared_budget() -> None:
    t, _ = table(tenant_background_hold_bytes=600, background_hold_bytes=1000, tenant_background_floor_bytes=100)
    hogs = [Box(write(b"x" * 5000), chunk=64) for _ in range(4)]
    for i, box in enumerate(hogs):  # nobody reads these: they fill the shared budget
        start(t, box, 7 + i, tenant=f"hog{i}")
    until(lambda: t.budget.held() >= 1000)
    data = bytes(range(256)) * 4
    box = Box(write(data), chunk=64)
    p = start(t, box, 20, tenant="e")
    box.script.append(end(0))
    assert read_all(p, 10) == (data, b"")  # stalled before, waiting for the others' clients
    assert t.budget.held() <= 1000 + 100 * 5
    for i, box in enumerate(hogs):
        box.signal_process("i1", 7 + i)


def test_a_busy_tenant_shares_its_budget_between_its_processes() -> None:
    t, _ = table(tenant_background_hold_bytes=400)
    start(t, Box(write(b"a" * 1000), chunk=50), 7)
    assert t.stream_hold("t") == 200  # one process: half the budget per stream (at most HOLD)
    start(t, Box(write(b"b" * 1000), chunk=50), 8)
    assert t.stream_hold("t") == 100
    time.sleep(0.4)
    assert t.budget.held("t") <= 400


# -- ended processes ---------------------------------------------------------------------------------

def test_an_ended_process_nobody_read_keeps_only_the_tail() -> None:
    t, runs = table(background_ended_tail_bytes=10)
    p = start(t, Box(write(b"0123456789" * 10, b"e" * 4), end(0, out=b"last line\n")))
    assert runs.wait() == ("success", 0, None)
    r = p.read(0, 0)
    assert r["stdout"] == b"last line\n" and r["stdout_skipped"] == r["stdout_dropped"] == 100
    assert r["stderr"] == b"eeee" and r["stderr_dropped"] == 0
    assert t.budget.held("t") == 14
    p.read(r["stdout_offset"], r["stderr_offset"])
    assert t.budget.held("t") == 0


def test_a_reader_keeps_all_of_the_end_until_its_grace_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    t, runs = table(background_ended_tail_bytes=4)
    box = Box(write(b"abc"))
    p = start(t, box)
    until(lambda: p.read(0, 0)["stdout"] == b"abc")  # a client reads it
    box.script.append(end(0, out=b"defghijkl"))
    assert runs.wait()[0] == "success"
    assert p.read(0, 0)["stdout"] == b"abcdefghijkl"  # read lately: nothing dropped
    monkeypatch.setattr(background, "READER_GRACE", 0.0)
    t.of_box("t", "s", "i1")  # any request on the session trims once the grace has passed
    r = p.read(0, 0)
    assert (r["stdout"], r["stdout_dropped"]) == (b"ijkl", 8)


def test_an_end_in_the_box_skips_to_the_tail_when_nobody_reads() -> None:
    t, runs = table(tenant_background_hold_bytes=64, background_ended_tail_bytes=16)
    out = bytes(range(200))
    box = Box(write(out, b"E" * 100), end(0), chunk=32)
    p = start(t, box)
    assert runs.wait(), "stuck behind the spent budget"
    r = p.read(0, 0)
    assert r["stdout"] == out[-16:] and r["stdout_dropped"] == 200 - 16 and r["stdout_skipped"] == 184
    assert r["stderr"] == b"E" * 16 and r["stderr_dropped"] == 84
    assert max(o for o, _ in box.polls) == 184  # what lay between was never fetched from the box


class GrowingBox(Box):
    """Box code keeps appending to an ended process's files: the box reports ever larger sizes
    (as an agent that trusted the files did) for ``grow`` polls once the service skipped to the
    tail of the end, in chunks of ``chunk``; then the rest at once, with the exit."""

    def __init__(self, *script: Any, grow: int, piece: int, chunk: int) -> None:
        super().__init__(*script, chunk=chunk)
        self.grow, self.piece = grow, piece
        self.skipped_at = 100 * 1024

    def poll_process(self, instance_id: str, pid: int, out_off: int, err_off: int) -> dict[str, Any]:
        with self.lock:
            if self.exit is not None and out_off > self.skipped_at:  # the service skipped to the tail
                if self.grow > 0:
                    self.grow -= 1
                    self.out += b"F" * self.piece
                else:
                    self.chunk = 1 << 30
        return super().poll_process(instance_id, pid, out_off, err_off)


def test_an_ended_process_whose_files_grow_holds_no_more_than_its_budget() -> None:
    t, runs = table(tenant_background_hold_bytes=64 * 1024, background_ended_tail_bytes=16 * 1024)
    out = b"o" * (200 * 1024)  # never read
    box = GrowingBox(write(out), end(0), grow=200, piece=8 * 1024, chunk=4 * 1024)
    p = start(t, box)
    peak = 0
    while not runs.done.is_set():
        peak = max(peak, t.budget.held("t"))
        time.sleep(0.0005)
    assert runs.wait()
    peak = max(peak, t.budget.held("t"))
    assert peak <= 64 * 1024, peak  # 1.6 MiB more came after the end: none of it is held
    r = p.read(0, 0)
    assert r["stdout"] == out[-16 * 1024:]  # nothing past the size the box reported at its end


# -- processes per tenant ----------------------------------------------------------------------------

def test_a_tenant_runs_at_most_its_cap_of_processes() -> None:
    t, runs = table(tenant_max_background_processes=2)
    b1, b2, b3 = Box(), Box(), Box()
    start(t, b1, 7)
    start(t, b2, 8, session="s2")
    with pytest.raises(RateLimitError) as e:
        t.running("t", "s3", "i1")  # a start checks this first
    assert (e.value.http_status, e.value.code) == (429, "SB008")
    assert e.value.details["reason"] == "tenant_max_background_processes"
    assert t.running("other", "s", "i1") == 0  # another tenant is not counted
    with pytest.raises(RateLimitError):  # a start that raced past the check: killed, audited
        start(t, b3, 9, session="s3")
    assert b3.signals == ["SIGKILL"] and runs.rows == [("error", None, "SB008")]
    b1.signal_process("i1", 7)
    until(lambda: t.budget.running("t") == 1)
    start(t, Box(), 10, session="s4")


# -- idle polling ------------------------------------------------------------------------------------

def test_a_quiet_process_is_polled_rarely_unless_a_client_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follower, "QUIET_AFTER", 0.3)  # quiet that long: polled every 2 s
    monkeypatch.setattr(bg_follower, "QUIET_AFTER", 5.0)  # read that lately: polled every 100 ms
    t, _ = table()
    box = Box(write(b"hello"))
    p = start(t, box)
    time.sleep(1.0)
    n = len(box.polls)
    time.sleep(1.0)
    assert len(box.polls) - n <= 1  # quiet: every 2 s (was every 100 ms)
    n = len(box.polls)
    p.read(0, 0)  # a read wakes the follower at once ...
    until(lambda: len(box.polls) > n, 0.5)
    time.sleep(0.5)  # ... and it polls every 100 ms while the client reads
    assert len(box.polls) - n >= 4
    box.signal_process("i1", 7)


# -- E2B streams -------------------------------------------------------------------------------------

def test_an_e2b_stream_that_does_not_keep_up_holds_the_output_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envd_bg, "SUBSCRIBER_HOLD", 300)
    budget = follower.Budget(10_000, 5_000, 8)
    data = bytes(range(256)) * 16  # 4 KiB in 100-byte polls
    box = Box(write(data), end(0), chunk=100)
    runs, forgot = Runs(), threading.Event()

    async def main() -> tuple[bytes, Any]:
        proc = envd_bg.Proc(7, pb.ProcessConfig(), None, box, "i1", background=True, budget=budget, tenant="t")  # type: ignore[arg-type]
        budget.admit("t")
        sub = proc.subscribe()
        envd_bg.start_follower(type("S", (), {"runs": runs})(), None, proc, time.monotonic() + 60, SPEC, forgot.set)
        await asyncio.sleep(0.5)  # the stream takes nothing: the follower stops at its hold
        assert 300 <= proc.backlog() < 400 and budget.held("t") == proc.backlog()
        assert max(o for o, _ in box.polls) < 400
        got, last = b"", None
        while (event := await sub.get()) is not None:
            if event.event.field == "data":
                got += event.event.value.output.value
            last = event
        sub.close()
        return got, last

    got, last = asyncio.run(main())
    assert got == data and last.event.field == "end" and last.event.value.exit_code == 0
    assert runs.wait() == ("success", 0, None) and forgot.is_set()
    assert budget.held("t") == 0 and budget.running("t") == 0


def test_a_closed_e2b_stream_no_longer_holds_output() -> None:
    budget = follower.Budget(10_000, 10_000, 8)

    async def main() -> None:
        proc = envd_bg.Proc(7, pb.ProcessConfig(), None, budget=budget, tenant="t")  # type: ignore[arg-type]
        slow, fast = proc.subscribe(), proc.subscribe()
        for _ in range(3):
            proc.reserve(10)
            proc.publish(envd_bg._data("stdout", b"0123456789"))
        await asyncio.sleep(0)
        for _ in range(3):
            await fast.get()
        assert proc.backlog() == 30 and budget.held("t") == 30  # the slow stream's queue
        slow.close()  # its client went away
        assert proc.backlog() == 0 and budget.held("t") == 0

    asyncio.run(main())


def test_the_limits_are_settings_with_secure_defaults() -> None:
    s = ServiceSettings.from_env({})
    assert (s.tenant_max_background_processes, s.tenant_background_hold_bytes, s.background_hold_bytes,
            s.background_ended_tail_bytes) == (64, 64 << 20, 256 << 20, 64 << 10)
    s = ServiceSettings.from_env({"SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES": "5",
                                  "SANDBOX_TENANT_BACKGROUND_HOLD_BYTES": "1048576",
                                  "SANDBOX_BACKGROUND_HOLD_BYTES": "8388608",
                                  "SANDBOX_BACKGROUND_ENDED_TAIL_BYTES": "0"})
    assert (s.tenant_max_background_processes, s.tenant_background_hold_bytes, s.background_hold_bytes,
            s.background_ended_tail_bytes) == (5, 1 << 20, 8 << 20, 0)
    with pytest.raises(InvalidConfigError, match="SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES"):
        ServiceSettings.from_env({"SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES": "0"})
    t = ProcessTable(Runs(), 8, s)  # type: ignore[arg-type]
    assert (t.budget.tenant_max_processes, t.budget.hold_bytes, t.tail) == (5, 8 << 20, 0)
    assert t.budget.tenant_floor_bytes == 64 << 10  # unset: a sixteenth of the tenant's budget


def test_the_tenant_floor_is_a_setting_within_the_tenant_budget() -> None:
    assert follower.Budget.from_settings(ServiceSettings.from_env({})).tenant_floor_bytes == 4 << 20
    s = ServiceSettings.from_env({"SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES": "1048576"})
    assert s.tenant_background_floor_bytes == 1 << 20
    assert follower.Budget.from_settings(s).tenant_floor_bytes == 1 << 20
    assert follower.Budget.from_settings(ServiceSettings.from_env({
        "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES": "0"})).tenant_floor_bytes == 0
    for bad in ("-1", "lots"):
        with pytest.raises(InvalidConfigError, match="SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES"):
            ServiceSettings.from_env({"SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES": bad})
    with pytest.raises(InvalidConfigError, match="SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES.*"
                                                 "SANDBOX_TENANT_BACKGROUND_HOLD_BYTES") as e:
        ServiceSettings.from_env({"SANDBOX_TENANT_BACKGROUND_HOLD_BYTES": "1048576",
                                  "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES": "1048577"})
    assert e.value.details["field"] == "SANDBOX_TENANT_BACKGROUND_FLOOR_BYTES"


def test_a_process_has_at_most_max_subscribers_e2b_streams() -> None:
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError

    async def main() -> None:
        proc = envd_bg.Proc(7, pb.ProcessConfig(), None, Box(), "i1", background=True)  # type: ignore[arg-type]
        subs = [proc.subscribe() for _ in range(envd_bg.MAX_SUBSCRIBERS)]
        with pytest.raises(ConnectError) as e:
            proc.subscribe()  # one Connect too many
        assert e.value.code == Code.RESOURCE_EXHAUSTED and "SB008" in e.value.message
        subs[0].close()  # a stream that ended makes room
        proc.subscribe()

    asyncio.run(main())
