"""Background processes whose box dies under them (review 35, F1), on a real service over the jail.

Every box is a fresh pid namespace, so the first process of the session's next box gets the same
small pid as the dead box's first one. Before the fix the dead box's processes were dropped (404),
and a client still polling or signalling "its" pid reached the new box's process. Now the dead
box's process reads ``lost`` (with why), and the new one gets another public id (an alias above
the kernel's pid range) while its ``box_pid`` is the pid in the box; the new one works as any."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from execbox.service.background import ProcessTable

from .conftest import Service, error_of

pytestmark = pytest.mark.timeout(180)

A = "/v1/sandbox/sessions/tenant-a"
ALIAS_BASE = 1 << 22


def _start(c: httpx.Client, session: str, command: str, **kw: Any) -> dict[str, Any]:
    r = c.post(f"{A}/{session}/processes", json={"command": command, **kw})
    assert r.status_code == 201, r.text
    return r.json()


def _read_until(c: httpx.Client, session: str, pid: int, want: str, seconds: float = 20) -> dict[str, Any]:
    deadline, out = time.monotonic() + seconds, ""
    while True:
        r = c.get(f"{A}/{session}/processes/{pid}", params={"stdout_offset": 0, "wait": 2})
        assert r.status_code == 200, r.text
        out = r.json()["stdout"]
        if want in out:
            return r.json()
        assert time.monotonic() < deadline, out[-300:]


def _kill_box(service: Service, session: str) -> str:
    s = service.app.state.services.sessions.get("tenant-a", session)
    dead = s.instance_id
    s.provider._instances[dead].box.kill()  # the box dies under its processes (OOM killer, crash)
    return dead


def _read_after_death(c: httpx.Client, session: str, pid: int) -> dict[str, Any]:
    """The dead box's process: SB009 at most once (the session's own report of its dead box), then
    ``lost``, never 404."""
    sb009 = 0
    for _ in range(10):
        r = c.get(f"{A}/{session}/processes/{pid}", params={"stdout_offset": 0})
        if r.status_code == 503:
            assert error_of(r)["code"] == "SB009" and sb009 == 0, r.text
            sb009 += 1
            continue
        assert r.status_code == 200, r.text  # not a 404: the process is remembered
        return r.json()
    raise AssertionError("no answer after the box died")


def test_a_process_whose_box_died_reads_lost_and_its_pid_never_reaches_the_next_box(service: Service) -> None:
    c, session = service.a, "pid-reuse"
    old = _start(c, session, "while sleep 0.2; do echo OLD-TICK; done")
    p = old["pid"]
    assert old["box_pid"] == p < ALIAS_BASE  # the normal case: the id is the pid in the box
    _read_until(c, session, p, "OLD-TICK")
    dead = _kill_box(service, session)

    lost = _read_after_death(c, session, p)
    assert (lost["pid"], lost["box_pid"], lost["status"], lost["running"]) == (p, p, "lost", False), lost
    assert "box" in lost["error"] and lost["command"] == old["command"], lost
    assert "OLD-TICK" in lost["stdout"]  # what it wrote before is still readable

    # the new box's first process gets the same pid in its box: another id here
    new = _start(c, session, "echo NEW-PROCESS; while read x; do echo got-$x; done; echo eof", stdin=True)
    assert service.app.state.services.sessions.get("tenant-a", session).instance_id != dead
    assert new["box_pid"] == p, (new, p)  # every box is a fresh pid namespace: the collision is real
    q = new["pid"]
    assert q != p and q > ALIAS_BASE and new["status"] == "running", new
    _read_until(c, session, q, "NEW-PROCESS")

    # the first client still polls and signals p: it reaches the lost process, never the new one
    again = c.get(f"{A}/{session}/processes/{p}", params={"stdout_offset": 0, "wait": 1}).json()
    assert again["status"] == "lost" and "NEW-PROCESS" not in again["stdout"], again
    r = c.post(f"{A}/{session}/processes/{p}/signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200 and r.json() == {"pid": p, "signal": "SIGKILL", "signalled": False,
                                                 "running": False}, r.text
    r = c.post(f"{A}/{session}/processes/{p}/stdin", json={"data": "x\n"})
    assert r.status_code == 409 and "has ended" in error_of(r)["message"], r.text
    listed = {x["pid"]: x for x in c.get(f"{A}/{session}/processes").json()["processes"]}
    assert listed[p]["status"] == "lost" and listed[p]["box_pid"] == p
    assert listed[q]["status"] == "running" and listed[q]["box_pid"] == p, listed

    # the new one works as any: stdin, output, a signal
    r = c.post(f"{A}/{session}/processes/{q}/stdin", json={"data": "one\n"})
    assert r.status_code == 200 and r.json()["pid"] == q, r.text
    _read_until(c, session, q, "got-one")
    r = c.post(f"{A}/{session}/processes/{q}/signal", json={"signal": "SIGTERM"})
    assert r.status_code == 200 and r.json()["signalled"] is True, r.text
    deadline = time.monotonic() + 20
    while (end := c.get(f"{A}/{session}/processes/{q}", params={"wait": 2}).json())["running"]:
        assert time.monotonic() < deadline, end
    assert end["status"] == "signalled" and end["pid"] == q and end["box_pid"] == p, end
    assert c.get(f"{A}/{session}/processes/{p}").json()["status"] == "lost"  # still the lost one
    c.post(f"{A}/{session}/close")


def test_a_lost_process_leaves_the_tenants_count_once(service: Service) -> None:
    """The lost process's place under the tenant's cap is freed once: not kept (new starts would
    be refused), not freed twice (the tenant could run more than it may)."""
    c, session = service.a, "pid-reuse-count"
    budget = service.app.state.services.processes.budget
    before = budget.running("tenant-a")
    first = _start(c, session, "sleep 300")
    assert budget.running("tenant-a") == before + 1
    _kill_box(service, session)
    assert _read_after_death(c, session, first["pid"])["status"] == "lost"
    deadline = time.monotonic() + 10
    while budget.running("tenant-a") != before:  # its follower sees the dead box at its next poll
        assert time.monotonic() < deadline, budget.running("tenant-a")
        time.sleep(0.05)
    second = _start(c, session, "sleep 300")
    assert budget.running("tenant-a") == before + 1
    time.sleep(1.0)  # the lost one's follower has long ended: nothing more leaves
    assert budget.running("tenant-a") == before + 1
    r = c.post(f"{A}/{session}/processes/{second['pid']}/signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200 and r.json()["running"] is False, r.text
    assert budget.running("tenant-a") == before
    c.post(f"{A}/{session}/close")


def test_a_new_service_life_adopts_the_aliased_process_under_its_alias(service: Service) -> None:
    """The alias is in the meta the start left with the box's agent: a new service life (a fresh
    process table on the same box, as after a Docker restart) adopts the process under it."""
    c, session = service.a, "pid-reuse-adopt"
    svc = service.app.state.services
    p = _start(c, session, "sleep 300")["pid"]
    _kill_box(service, session)
    assert _read_after_death(c, session, p)["status"] == "lost"
    new = _start(c, session, "while read x; do echo got-$x; done", stdin=True)
    q = new["pid"]
    assert new["box_pid"] == p and q > ALIAS_BASE, new

    earlier = svc.processes
    for key in list(earlier._procs):  # the earlier life ends: its followers stop
        for proc in earlier._procs.pop(key).values():
            proc.forget()
    svc.processes = ProcessTable(svc.runs, svc.settings.max_background_processes)
    try:
        r = c.post(f"{A}/{session}/processes/{q}/stdin", json={"data": "two\n"})
        assert r.status_code == 200, r.text
        got = _read_until(c, session, q, "got-two")
        assert (got["pid"], got["box_pid"], got["adopted"], got["status"]) == (q, p, True, "running"), got
        listed = c.get(f"{A}/{session}/processes").json()["processes"]
        assert [(x["pid"], x["box_pid"], x.get("adopted")) for x in listed] == [(q, p, True)], listed
        r = c.post(f"{A}/{session}/processes/{p}/signal", json={"signal": "SIGKILL"})
        assert r.status_code == 404, r.text  # this life never knew the lost one: never the adopted one
        r = c.post(f"{A}/{session}/processes/{q}/signal", json={"signal": "SIGKILL"})
        assert r.status_code == 200 and r.json()["running"] is False, r.text
    finally:
        svc.processes = earlier
        c.post(f"{A}/{session}/close")


def test_a_process_of_a_paused_box_reads_lost_because_its_box_ended(service: Service) -> None:
    # its follower's poll meets the destroyed box first (a 404): that is still the box ending
    # under it, not the box forgetting the process
    from execbox.service.bg_adopt import BOX_ENDED

    c, session = service.a, "paused-proc"
    p = _start(c, session, "while sleep 0.2; do echo TICK; done")["pid"]
    _read_until(c, session, p, "TICK")
    assert c.post(f"{A}/{session}/pause").status_code == 200
    assert c.post(f"{A}/{session}/resume").status_code == 200
    r = c.get(f"{A}/{session}/processes/{p}", params={"stdout_offset": 0})
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["error"]) == ("lost", BOX_ENDED), r.json()
