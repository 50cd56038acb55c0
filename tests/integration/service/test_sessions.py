"""Session lifecycle on a real service: idle reaping, limits, rate limiting, box death and recovery."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import pytest

from .conftest import Service, error_of


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_idle_sessions_are_reaped_with_their_box_and_workspace(service_factory) -> None:
    svc: Service = service_factory(idle_timeout=1.0, reap_interval=0.2)
    c = svc.a
    c.post("/v1/sandbox/execute", json={"code": "open('f','w').write('1')", "session_id": "idle"})
    busy = threading.Thread(target=lambda: svc.a.post("/v1/sandbox/execute", json={
        "code": "import time; time.sleep(2.5)", "session_id": "busy"}))
    busy.start()
    s = svc.app.state.services.sessions.get("tenant-a", "idle")
    provider, instance_id, workspace = s.provider, s.instance_id, s.workspace
    assert os.path.isdir(workspace) and provider.instance_alive(instance_id)
    sessions = svc.app.state.services.sessions
    assert _wait(lambda: sessions.get("tenant-a", "idle") is None, 5), sessions.list()
    assert _wait(lambda: not os.path.exists(workspace), 5)
    assert not provider.instance_alive(instance_id)
    assert svc.app.state.services.sessions.get("tenant-a", "busy") is not None  # running: never reaped mid-run
    busy.join()
    metrics = svc.client().get("/metrics").text
    assert "execbox_sessions_reaped_total 1.0" in metrics or "execbox_sessions_reaped_total 2.0" in metrics


def test_max_sessions_is_503_sb004_with_the_reason(service_factory) -> None:
    svc: Service = service_factory(max_sessions=2)
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "m1"}).status_code == 200
    assert svc.b.post("/v1/sandbox/execute", json={"code": "1", "session_id": "m2"}).status_code == 200
    r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "m3"})
    assert r.status_code == 503
    err = error_of(r)
    assert err["code"] == "SB004" and err["details"]["reason"] == "max_sessions" and err["details"]["limit"] == 2
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "m1"}).status_code == 200
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1"}).status_code == 200  # one-shot still runs
    svc.root.delete("/v1/sandbox/sessions/tenant-b/m2")
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "m3"}).status_code == 200


def test_tenant_session_limit_is_429_sb008(service_factory) -> None:
    svc: Service = service_factory(tenant_max_sessions=1)
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "t1"}).status_code == 200
    r = svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "t2"})
    assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_sessions"
    assert svc.b.post("/v1/sandbox/execute", json={"code": "1", "session_id": "t2"}).status_code == 200


def test_concurrent_executions_per_tenant_are_rate_limited(service_factory) -> None:
    svc: Service = service_factory(tenant_max_executions=1)
    started = threading.Event()
    results: list[int] = []

    def slow() -> None:
        started.set()
        results.append(svc.a.post("/v1/sandbox/execute", json={"code": "import time; time.sleep(1.5)"}).status_code)

    t = threading.Thread(target=slow)
    t.start()
    started.wait()
    assert _wait(lambda: svc.app.state.services.sessions._running.get("tenant-a") == 1, 5)
    r = svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"})
    assert r.status_code == 429
    err = error_of(r)
    assert err["code"] == "SB008" and err["details"]["reason"] == "tenant_max_executions"
    assert r.headers["retry-after"] == "1"
    assert svc.b.post("/v1/sandbox/execute", json={"code": "print(1)"}).status_code == 200  # other tenant
    t.join()
    assert results == [200]
    assert svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"}).status_code == 200  # slot freed
    assert 'execbox_rate_limit_rejections_total{limit="executions"} 1.0' in svc.client().get("/metrics").text


def test_executions_in_one_session_are_serialized(service: Service) -> None:
    code = ("import os, time\nfd = os.open('lock', os.O_CREAT | os.O_EXCL | os.O_WRONLY)\n"
            "time.sleep(0.3)\nos.close(fd); os.unlink('lock')\nprint('ok')")
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(service.a.post(
        "/v1/sandbox/execute", json={"code": code, "session_id": "serial"}).json()["stdout"])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == ["ok\n"] * 3  # an overlapping run would have failed to create 'lock'


def test_runs_waiting_their_turn_on_a_session_hold_no_execution_slot(service_factory) -> None:
    """Six runs queued on one session with a limit of two executions: all run, one after the
    other (only the one holding the session counts); two other sessions busy at once still
    meet the limit."""
    svc: Service = service_factory(tenant_max_executions=2)
    code = "import time; time.sleep(0.3); print('ok')"
    out: list[int] = []

    def post(session: str, run: str = code) -> None:
        out.append(svc.a.post("/v1/sandbox/execute", json={"code": run, "session_id": session}).status_code)

    for session in ("queue", "busy0", "busy1"):  # their boxes made beforehand
        assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": session}).status_code == 200
    threads = [threading.Thread(target=post, args=("queue",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [200] * 6
    sessions = svc.app.state.services.sessions
    assert sessions._running.get("tenant-a") is None  # every slot given back
    slow = [threading.Thread(target=post, args=(f"busy{i}", "import time; time.sleep(2)")) for i in range(2)]
    out.clear()
    for t in slow:
        t.start()
    assert _wait(lambda: sessions._running.get("tenant-a") == 2, 10)
    r = svc.a.post("/v1/sandbox/execute", json={"code": "print(1)", "session_id": "third"})
    assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_executions"
    for t in slow:
        t.join()
    assert out == [200, 200]


def test_a_run_refused_for_the_executions_limit_leaves_no_session(service_factory) -> None:
    """Refused before it waits or creates anything: no row for the named session, nothing held
    against SANDBOX_TENANT_MAX_SESSIONS (review 43 F1)."""
    svc: Service = service_factory(tenant_max_executions=1, tenant_max_sessions=3)
    sessions = svc.app.state.services.sessions
    busy = threading.Thread(target=lambda: svc.a.post("/v1/sandbox/execute", json={
        "code": "import time; time.sleep(3)", "session_id": "s1"}))
    busy.start()
    assert _wait(lambda: sessions._running.get("tenant-a") == 1, 10)
    for name in ("n1", "n2"):
        r = svc.a.post("/v1/sandbox/execute", json={"code": "print(1)", "session_id": name})
        assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_executions"
        assert sessions.registry.get("tenant-a", name) is None
    busy.join()
    r = svc.a.post("/v1/sandbox/execute", json={"code": "print(3)", "session_id": "n3"})
    assert r.status_code == 200 and r.json()["stdout"] == "3\n", r.text


def test_a_new_session_whose_run_loses_the_last_slot_after_arriving_is_forgotten(service_factory) -> None:
    """The race the check on arrival leaves (review 46 F2): the limit is free when the run arrives,
    taken by another request before the run holds its new session; the refused run's session row
    goes with it."""
    svc: Service = service_factory(tenant_max_executions=1)
    sessions = svc.app.state.services.sessions
    sessions._counters.check = lambda *a, **k: None  # the arrival check passed, then:
    with sessions.execution_slot("tenant-a"):  # another request took the last slot
        r = svc.a.post("/v1/sandbox/execute", json={"code": "print(1)", "session_id": "raced"})
        assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_executions"
    assert sessions.registry.get("tenant-a", "raced") is None and sessions.get("tenant-a", "raced") is None
    r = svc.a.post("/v1/sandbox/execute", json={"code": "print(2)", "session_id": "raced"})
    assert r.status_code == 200 and r.json()["stdout"] == "2\n"


def test_pausing_idle_sessions_goes_on_past_one_that_fails(service_factory) -> None:
    """One idle session whose pause raises (its box cannot be removed now) does not stop the
    sweep: the others are paused, and it is tried again (review 46 F4)."""
    svc: Service = service_factory(idle_timeout=0.5, reap_interval=0.2, idle_action="pause")
    sessions = svc.app.state.services.sessions
    real = sessions._pause_locked
    failing = {"first"}

    def pause(s):  # noqa: ANN001
        if s.session_id in failing:
            raise RuntimeError("the provider cannot remove this box now")
        return real(s)

    sessions._pause_locked = pause
    for name in ("first", "second", "third"):
        assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": name}).status_code == 200
    assert _wait(lambda: all(svc.store.sessions.get("tenant-a", n).state == "paused" for n in ("second", "third")), 10)
    assert svc.store.sessions.get("tenant-a", "first").state == "running"
    failing.clear()
    assert _wait(lambda: svc.store.sessions.get("tenant-a", "first").state == "paused", 10)


def test_a_box_not_yet_reattached_is_not_forgotten_while_the_provider_is_starting(service: Service) -> None:
    """Destroying or pausing a session whose box was not re-attached yet removes that box by its
    row's handle; while no provider is ready that is an SB009 and the handle is kept for the retry,
    not dropped with the box left running unnamed (review 46 F3)."""
    from execbox.errors import ProviderUnavailableError
    from execbox.service.sessions.model import Session
    from execbox.service.sessions.registry import SessionRecord

    sessions = service.app.state.services.sessions
    rec = SessionRecord(id="ses_x", tenant_id="tenant-a", session_id="pending", state="running",
                        provider="docker", box_handle={"instance_id": "i1", "container_id": "c1"})
    s = Session("tenant-a", "pending", None, pending_handle=rec)
    current = sessions._current_or_none
    sessions._current_or_none = lambda: None  # the provider is still starting
    try:
        with pytest.raises(ProviderUnavailableError):
            sessions._remove_pending_box(s)
    finally:
        sessions._current_or_none = current
    assert s.pending_handle is rec


def test_process_calls_waiting_for_a_held_session_hold_no_execution_slot(service_factory) -> None:
    """A stdin write or signal that waits while its session is held by something other than a run
    (a package install, a resume) holds none of the tenant's executions meanwhile (review 43 F2)."""
    svc: Service = service_factory(tenant_max_executions=2)  # the two waiting calls would fill it
    sessions = svc.app.state.services.sessions
    base = "/v1/sandbox/sessions/tenant-a/p/processes"
    r = svc.a.post(base, json={"command": "trap '' USR1; cat", "stdin": True})  # USR1: ignored
    assert r.status_code == 201, r.text
    pid = r.json()["pid"]
    assert svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "other"}).status_code == 200
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # as an install holds the session
        with sessions.session("tenant-a", "p"):
            held.set()
            release.wait(20)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    waited: list[httpx.Response] = []
    calls = [threading.Thread(target=lambda: waited.append(svc.a.post(f"{base}/{pid}/stdin", json={"data": "x\n"}))),
             threading.Thread(target=lambda: waited.append(svc.a.post(f"{base}/{pid}/signal",
                                                                       json={"signal": "SIGUSR1"})))]
    for t in calls:
        t.start()
    time.sleep(0.5)  # both wait for the session now
    try:
        r = svc.a.post("/v1/sandbox/execute", json={"code": "print(2)", "session_id": "other"})
        assert r.status_code == 200 and r.json()["stdout"] == "2\n", r.text
    finally:
        release.set()
        holder.join()
        for t in calls:
            t.join()
    assert sorted(w.status_code for w in waited) == [200, 200], [w.text for w in waited]


def test_an_mcp_listing_waiting_for_a_held_session_holds_no_execution_slot(service_factory) -> None:
    """``resources/list`` reads each running session's files; waiting for a session something else
    holds (an install), it holds none of the tenant's executions meanwhile (review 43 F2)."""
    from execbox.mcp.core import Caller, ServiceCore

    svc: Service = service_factory(tenant_max_executions=1)
    services = svc.app.state.services
    core = ServiceCore(services.sessions, services.runs, default_timeout=30)
    assert svc.a.post("/v1/sandbox/write", json={"session_id": "p", "path": "f.txt", "content": "x"}).status_code == 200
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # as an install holds the session
        with services.sessions.session("tenant-a", "p"):
            held.set()
            release.wait(20)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    listed: list[Any] = []
    lister = threading.Thread(target=lambda: listed.append(core.list_running_files(Caller("tenant-a"), "p")))
    lister.start()
    time.sleep(0.5)  # the listing waits for the session now
    try:
        r = svc.a.post("/v1/sandbox/execute", json={"code": "print(2)", "session_id": "other"})
        assert r.status_code == 200 and r.json()["stdout"] == "2\n", r.text
    finally:
        release.set()
        holder.join()
        lister.join(30)
    [files] = listed
    assert "f.txt" in [f.path for f in files]


def test_dead_box_is_reported_once_then_recreated_with_its_workspace(service: Service) -> None:
    c = service.a
    c.post("/v1/sandbox/write", json={"session_id": "phoenix", "path": "keep.txt", "content": "survives"})
    s = service.app.state.services.sessions.get("tenant-a", "phoenix")
    first_instance = s.instance_id
    s.provider._instances[first_instance].box.kill()  # the box dies between requests (OOM killer, crash)
    r = c.post("/v1/sandbox/execute", json={"code": "print(1)", "session_id": "phoenix"})
    assert r.status_code == 503
    err = error_of(r)
    assert err["code"] == "SB009" and err["details"]["box_died"] and err["details"]["recreated_on_next_use"]
    assert c.get("/v1/sandbox/sessions/tenant-a/phoenix").json()["contexts_lost"] is True  # the row says so
    r = c.post("/v1/sandbox/execute", json={"code": "print(open('keep.txt').read())", "session_id": "phoenix"})
    assert r.status_code == 200 and r.json()["stdout"] == "survives\n"
    assert r.json()["metadata"]["instance_id"] != first_instance
    assert r.json()["metadata"]["session"]["contexts_lost"] is True  # reported once, by the first run after
    r = c.post("/v1/sandbox/execute", json={"code": "print(2)", "session_id": "phoenix"})
    assert "contexts_lost" not in (r.json()["metadata"].get("session") or {})
    assert service.app.state.services.sessions.get("tenant-a", "phoenix").boxes_started == 2


def test_box_dying_mid_run_is_sb009_once(service: Service) -> None:
    c = service.a
    c.post("/v1/sandbox/write", json={"session_id": "crash", "path": "keep.txt", "content": "still here"})
    s = service.app.state.services.sessions.get("tenant-a", "crash")
    box = s.provider._instances[s.instance_id].box
    ctx = c.post("/v1/sandbox/execute", json={"code": "x = 41", "session_id": "crash", "context_id": "nb"})
    assert ctx.status_code == 200
    threading.Timer(0.5, box.kill).start()
    r = c.post("/v1/sandbox/execute", json={"code": "import time; time.sleep(20)", "session_id": "crash"})
    assert r.status_code == 503 and error_of(r)["code"] == "SB009"
    r = c.post("/v1/sandbox/execute", json={"code": "print(x + 1)", "session_id": "crash", "context_id": "nb"})
    assert r.status_code == 200 and r.json()["error"]["name"] == "NameError"  # the context died with its box,
    assert r.json()["metadata"]["session"]["contexts_lost"] is True  # and the first run after says so
    r = c.post("/v1/sandbox/execute", json={"code": "print(open('keep.txt').read())", "session_id": "crash"})
    assert r.status_code == 200 and r.json()["stdout"] == "still here\n"


def test_shutdown_stops_every_box_and_keeps_sessions_for_the_next_start(jail_provider) -> None:
    from .conftest import start_service

    before = {i.instance_id for i in jail_provider.list_instances()}  # other modules' services
    svc = start_service(jail_provider)
    threads = [threading.Thread(target=lambda i=i: svc.a.post("/v1/sandbox/execute", json={
        "code": "import time; time.sleep(0.2)", **({"session_id": f"s{i}"} if i % 2 else {})}))
        for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert svc.app.state.services.sessions.count() == 3
    svc.stop()
    assert {i.instance_id for i in jail_provider.list_instances()} - before == set()  # no box left
    # the sessions survive in the registry with their workspaces (one-shots leave nothing)
    assert sorted(os.listdir(os.path.join(svc.workspaces, "tenant-a"))) == ["s1", "s3", "s5"]
    rows = svc.store.sessions.list("tenant-a")
    assert [(r.session_id, r.state) for r in rows] == [("s1", "running"), ("s3", "running"), ("s5", "running")]


def test_requests_queued_on_a_busy_session_are_bounded_per_tenant(service_factory) -> None:
    svc: Service = service_factory(tenant_max_requests=2)
    svc.a.post("/v1/sandbox/write", json={"session_id": "q", "path": "f", "content": "1"})
    slow = threading.Thread(target=lambda: svc.a.post("/v1/sandbox/execute", json={
        "code": "import time; time.sleep(1.5)", "session_id": "q"}))
    slow.start()
    assert _wait(lambda: svc.app.state.services.sessions._inflight.get("tenant-a") == 1, 5)
    # runs queue behind the session's run (file operations would go beside it)
    queued = threading.Thread(target=lambda: svc.a.post("/v1/sandbox/execute", json={"code": "1", "session_id": "q"}))
    queued.start()
    assert _wait(lambda: svc.app.state.services.sessions._inflight.get("tenant-a") == 2, 5)
    r = svc.a.post("/v1/sandbox/execute", json={"code": "2", "session_id": "q"})
    assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_requests"
    assert svc.b.post("/v1/sandbox/read", json={"session_id": "q", "path": "f"}).status_code == 404  # B unaffected
    slow.join()
    queued.join()
    assert svc.a.post("/v1/sandbox/read", json={"session_id": "q", "path": "f"}).json()["content"] == "1"
