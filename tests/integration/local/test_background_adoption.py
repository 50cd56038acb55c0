"""A new service life adopts the background processes an earlier one left in a box that lives on
(service/background.py ``ProcessTable.adopt``), against a real agent (local provider): the earlier
service is played by starting processes the way ``ProcessOps.start`` does (``proc.start`` with
``start_meta``) and reading some of their output; the new one is a fresh ``ProcessTable`` on the
same box. The Docker restart of a real ``execbox serve`` is tests/integration/docker/
test_background_restart.py."""

from __future__ import annotations

import time

import pytest

from execbox.errors import ProviderUnavailableError, RateLimitError
from execbox.service.background import BgProcess, ProcessTable, start_meta
from execbox.service.config import ServiceSettings
from tests.unit.test_process_followers import Runs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def box():
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_memory": "512m"})
    inst = p.create_instance("python")
    p.run_command(inst.instance_id, "mkdir -p sub")
    yield p, inst.instance_id
    p.shutdown()


def earlier_start(p, iid: str, command: str, *, session: str = "s", cwd: str | None = None, stdin: bool = False,
                  timeout: float | None = None, started_at: float | None = None) -> int:
    """A process started by the service's earlier life (as ProcessOps.start sends it)."""
    meta = start_meta("t", session, cwd, stdin, timeout, time.time() if started_at is None else started_at,
                      "ab" * 16)
    return p.start_process(iid, command, cwd=cwd, stdin=stdin, meta=meta)


def until(check, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.02)


def read_until(proc: BgProcess, want: bytes, offset: int = 0, seconds: float = 30.0) -> tuple[bytes, dict]:
    got, first = b"", None
    deadline = time.monotonic() + seconds
    while want not in got:
        assert time.monotonic() < deadline, got[-200:]
        r = proc.read(offset + len(got), 0)
        first = first or r
        got += r["stdout"]
        time.sleep(0.02)
    assert first is not None
    return got, first


def test_a_new_life_adopts_lists_reads_feeds_and_counts_the_processes_left_in_the_box(box) -> None:
    p, iid = box
    started = time.time() - 3
    reader = earlier_start(p, iid, "while read x; do echo got-$x; done; echo eof", cwd="sub", stdin=True,
                           timeout=600, started_at=started)
    chatty = earlier_start(p, iid, "head -c 2100000 /dev/zero | tr '\\0' a; echo; "
                                   "for i in $(seq 1 400); do echo line-$i; sleep 0.05; done")
    spare = earlier_start(p, iid, "sleep 300")
    e2b = p.start_process(iid, "sleep 301")  # started without meta (the E2B facade's): never adopted
    other = earlier_start(p, iid, "sleep 302", session="s2")  # another session's meta: never adopted
    # the earlier life read 2 MiB of the chatty one, so the box freed what lies before (page-aligned)
    taken = 0
    while taken < 2 * 1024 * 1024:
        taken += len(p.poll_process(iid, chatty, taken, 0)["stdout"])
    p.poll_process(iid, chatty, taken, 0)
    freed = next(e for e in p.list_processes(iid) if e["pid"] == chatty)["stdout_from"]
    assert freed >= 2 * 1024 * 1024 - 4096

    runs = Runs()
    table = ProcessTable(runs, 8, ServiceSettings(tenant_max_background_processes=2))  # type: ignore[arg-type]
    table.adopt(p, "t", "s", iid)
    procs = {q.pid: q for q in table.of_box("t", "s", iid)}
    assert set(procs) == {reader, chatty, spare}
    info = procs[reader].info()
    assert (info["command"], info["cwd"], info["stdin"], info["timeout"], info["running"], info["adopted"]) == (
        "while read x; do echo got-$x; done; echo eof", "sub", True, 600.0, True, True)
    assert abs(info["started_at"] - started) < 1e-3
    assert procs[chatty].info()["stdin"] is False and procs[chatty].info()["timeout"] is None
    # three adopted, the cap is two: the last is adopted anyway, says so, and starts are refused
    assert table.budget.running("t") == 2
    assert sum(bool(q.info().get("over_tenant_cap")) for q in procs.values()) == 1
    with pytest.raises(RateLimitError) as full:
        table.running("t", "s", iid)
    assert full.value.details["reason"] == "tenant_max_background_processes"
    table.adopt(p, "t", "s", iid)  # once per box: nothing adopted twice
    assert len(table.of_box("t", "s", iid)) == 3 and table.budget.running("t") == 2

    # output from the first byte the box still holds: the bytes it freed are reported dropped
    got, first = read_until(procs[chatty], b"line-3\n")
    assert first["stdout_skipped"] == freed and first["stdout_dropped"] == freed
    assert got.startswith(b"a") and b"\nline-1\nline-2\nline-3\n" in got

    p.process_input(iid, reader, b"one\n")
    p.close_process_input(iid, reader)
    out, _ = read_until(procs[reader], b"eof\n")
    assert out == b"got-one\neof\n"
    until(lambda: procs[reader].ended)
    assert procs[reader].info()["exit_code"] == 0
    # one ended: the one over the cap is counted now, so the tenant is still at its cap
    assert not any(q.info().get("over_tenant_cap") for q in procs.values())
    assert table.budget.running("t") == 2
    with pytest.raises(RateLimitError):
        table.running("t", "s", iid)

    assert p.signal_process(iid, spare, "SIGTERM") is True
    until(lambda: procs[spare].ended)
    assert procs[spare].info()["status"] == "signalled" and procs[spare].info()["signal"] == 15
    assert table.running("t", "s", iid) == 1 and table.budget.running("t") == 1  # a start fits again
    p.signal_process(iid, chatty, "SIGKILL")
    until(lambda: procs[chatty].ended)
    until(lambda: len(runs.rows) == 3)
    assert sorted(r[0] for r in runs.rows) == ["cancelled", "cancelled", "success"]
    assert table.budget.running("t") == 0
    for pid in (e2b, other):
        p.signal_process(iid, pid, "SIGKILL")


def test_an_adopted_process_past_its_timeout_ends_timed_out(box) -> None:
    p, iid = box
    pid = earlier_start(p, iid, "sleep 300", timeout=5, started_at=time.time() - 60)
    runs = Runs()
    table = ProcessTable(runs, 8, ServiceSettings())  # type: ignore[arg-type]
    table.adopt(p, "t", "s", iid)
    (proc,) = table.of_box("t", "s", iid)
    until(lambda: proc.ended)
    assert proc.info()["status"] == "timed_out" and proc.info()["timed_out"] is True
    assert runs.wait() == ("timeout", -9, "SB005")
    assert pid not in [e["pid"] for e in p.list_processes(iid)]  # killed and reported: the box forgot it


class Flaky:
    """The real provider, whose polls fail while ``failing`` (a box this replica lost for a while)."""

    def __init__(self, real) -> None:
        self.real, self.failing = real, False

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def poll_process(self, *args, **kwargs):
        if self.failing:
            raise ProviderUnavailableError("the box is gone")
        return self.real.poll_process(*args, **kwargs)


def test_a_process_lost_while_the_box_lives_on_is_adopted_again_at_the_next_request(box) -> None:
    p, iid = box
    pid = earlier_start(p, iid, "for i in $(seq 1 600); do echo n-$i; sleep 0.05; done")
    flaky = Flaky(p)
    runs = Runs()
    table = ProcessTable(runs, 8, ServiceSettings())  # type: ignore[arg-type]
    table.adopt(flaky, "t", "s", iid)
    (first,) = table.of_box("t", "s", iid)
    read_until(first, b"n-2\n")
    flaky.failing = True
    until(lambda: first.ended)
    assert first.info()["status"] == "lost"
    flaky.failing = False
    table.adopt(flaky, "t", "s", iid)  # the next request lists the box again
    (again,) = table.of_box("t", "s", iid)
    assert again is not first and again.pid == pid and again.info()["running"] is True
    read_until(again, b"n-30\n")
    assert table.budget.running("t") == 1
    p.signal_process(iid, pid, "SIGKILL")
    until(lambda: again.ended)
    assert table.budget.running("t") == 0
