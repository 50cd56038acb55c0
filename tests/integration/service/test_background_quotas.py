"""What background processes may cost the service, on a real service over the jail (small limits
from ServiceSettings): a tenant runs at most SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES at once across
its sessions and the E2B facade (429 SB008 with Retry-After, RateLimitException); the output the
service holds stays within the tenant's budget while nobody reads, and a reader then gets all of
it; an ended process nobody read keeps only its tail (``stdout_dropped`` says how much went); an
E2B stream that does not keep up holds the output back within the budget and loses nothing."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from .conftest import error_of

A = "/v1/sandbox/sessions/tenant-a"


def _until(check: Any, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while not (got := check()):
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)
    return got


def _start(c: httpx.Client, session: str, command: str) -> httpx.Response:
    return c.post(f"{A}/{session}/processes", json={"command": command})


def _budget(svc: Any) -> Any:
    return svc.app.state.services.processes.budget


def test_a_tenant_runs_at_most_its_cap_of_processes_across_sessions(service_factory) -> None:
    svc = service_factory(tenant_max_background_processes=2)
    c = svc.client(svc.tenant_a)
    pids = [_start(c, s, "sleep 60").json()["pid"] for s in ("q1", "q2")]
    r = _start(c, "q3", "sleep 60")
    assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
    err = error_of(r)
    assert err["code"] == "SB008" and err["details"]["reason"] == "tenant_max_background_processes"
    assert "SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES" in err["message"]
    other = svc.client(svc.tenant_b).post("/v1/sandbox/sessions/tenant-b/q1/processes", json={"command": "true"})
    assert other.status_code == 201  # another tenant has its own count
    assert c.post(f"{A}/q1/processes/{pids[0]}/signal", json={"signal": "SIGKILL"}).json()["running"] is False
    _until(lambda: _start(c, "q3", "sleep 60").status_code == 201)  # its place is free again


def test_held_output_stays_within_the_budget_and_a_reader_gets_all_of_it(service_factory) -> None:
    svc = service_factory(tenant_background_hold_bytes=256 * 1024)
    c = svc.client(svc.tenant_a)
    pid = _start(c, "h1", "seq 1 400000; echo done >&2").json()["pid"]  # 2.7 MB
    first = c.get(f"{A}/h1/processes/{pid}", params={"wait": 10}).json()  # a client reads it, then pauses
    time.sleep(1.5)
    assert _budget(svc).held("tenant-a") <= 256 * 1024  # the rest waits in the box
    assert c.get(f"{A}/h1/processes").json()["processes"][0]["running"] is True
    out, err, offs = first["stdout"], first["stderr"], {"stdout_offset": first["stdout_offset"],
                                                        "stderr_offset": first["stderr_offset"]}
    while True:
        j = c.get(f"{A}/h1/processes/{pid}", params={**offs, "wait": 10}).json()
        assert j["stdout_skipped"] == 0 and j["stdout_dropped"] == 0
        out, err = out + j["stdout"], err + j["stderr"]
        offs = {"stdout_offset": j["stdout_offset"], "stderr_offset": j["stderr_offset"]}
        if not j["running"] and not j["stdout"] and not j["stderr"]:
            break
    assert out == "".join(f"{i}\n" for i in range(1, 400001)) and err == "done\n"
    assert j["status"] == "exited" and _budget(svc).held("tenant-a") == 0


def test_a_tenant_reads_its_output_while_another_fills_the_service_budget(service_factory) -> None:
    svc = service_factory(background_hold_bytes=128 * 1024, tenant_background_hold_bytes=512 * 1024,
                          tenant_background_floor_bytes=32 * 1024)
    a, b = svc.client(svc.tenant_a), svc.client(svc.tenant_b)
    hogs = [_start(a, f"f{i}", "seq 1 400000; sleep 60").json()["pid"] for i in (1, 2)]  # 2.7 MB each, unread
    _until(lambda: _budget(svc).held() >= 128 * 1024)  # the service-wide budget is spent
    time.sleep(0.5)
    assert _budget(svc).held() == 128 * 1024  # and stays so: the rest waits in the box
    B = "/v1/sandbox/sessions/tenant-b/f1/processes"
    pid = b.post(B, json={"command": "seq 1 50000"}).json()["pid"]  # 289 KB: more than its floor
    out, offset, deadline = "", 0, time.monotonic() + 30
    while True:  # tenant-a's output waits for its clients; tenant-b's goes on within its floor
        j = b.get(f"{B}/{pid}", params={"stdout_offset": offset, "wait": 5}).json()
        out, offset = out + j["stdout"], j["stdout_offset"]
        if not j["running"] and not j["stdout"]:
            break
        assert time.monotonic() < deadline, f"stalled at {offset} bytes behind another tenant's output"
    assert out == "".join(f"{i}\n" for i in range(1, 50001)) and j["status"] == "exited"
    assert _budget(svc).held("tenant-a") == 128 * 1024  # still unread
    assert _budget(svc).held() <= 128 * 1024 + 2 * 32 * 1024
    for i, hog in zip((1, 2), hogs, strict=True):
        a.post(f"{A}/f{i}/processes/{hog}/signal", json={"signal": "SIGKILL"})


def test_an_ended_process_nobody_read_keeps_only_the_tail(service_factory) -> None:
    svc = service_factory(background_ended_tail_bytes=1000)
    c = svc.client(svc.tenant_a)
    pid = _start(c, "t1", "seq 1 100000; echo the end").json()["pid"]
    _until(lambda: not c.get(f"{A}/t1/processes").json()["processes"][0]["running"])
    j = c.get(f"{A}/t1/processes/{pid}").json()
    total = len("".join(f"{i}\n" for i in range(1, 100001))) + len("the end\n")
    assert j["stdout"].endswith("99999\n100000\nthe end\n") and len(j["stdout"]) <= 1000
    assert j["stdout_dropped"] == j["stdout_skipped"] == total - len(j["stdout"])
    assert j["status"] == "exited" and j["exit_code"] == 0
    assert _budget(svc).held("tenant-a") == len(j["stdout"])


e2b = pytest.importorskip("e2b")


def _sandbox(url: str, token: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", token)
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return e2b.Sandbox.create(timeout=120)


def test_e2b_processes_count_against_the_tenant_cap(service_factory, monkeypatch) -> None:
    svc = service_factory(tenant_max_background_processes=2)
    c = svc.client(svc.tenant_a)
    assert _start(c, "e1", "sleep 60").status_code == 201
    sbx = _sandbox(svc.url, svc.tenant_a, monkeypatch)
    try:
        h = sbx.commands.run("sleep 60", background=True, timeout=0)
        with pytest.raises(e2b.RateLimitException, match="SANDBOX_TENANT_MAX_BACKGROUND_PROCESSES"):
            sbx.commands.run("echo hi")
        r = _start(c, "e2", "sleep 60")
        assert r.status_code == 429 and error_of(r)["details"]["reason"] == "tenant_max_background_processes"
        h.kill()
        _until(lambda: _budget(svc).running("tenant-a") == 1)
        assert sbx.commands.run("echo hi").stdout == "hi\n"
    finally:
        sbx.kill()


def test_an_e2b_stream_that_does_not_keep_up_holds_output_back(service_factory, monkeypatch) -> None:
    svc = service_factory(tenant_background_hold_bytes=1024 * 1024)
    sbx = _sandbox(svc.url, svc.tenant_a, monkeypatch)
    try:
        h = sbx.commands.run("seq 1 3000000", background=True, timeout=0)  # 21 MB, not read for a while
        peak = 0
        for _ in range(30):
            peak = max(peak, _budget(svc).held("tenant-a"))
            time.sleep(0.1)
        assert 0 < peak <= 1024 * 1024
        result = h.wait()
        assert result.exit_code == 0 and len(result.stdout) == len("".join(f"{i}\n" for i in range(1, 3000001)))
        assert result.stdout.endswith("2999999\n3000000\n")
        _until(lambda: _budget(svc).held("tenant-a") == 0, 10)
    finally:
        sbx.kill()
